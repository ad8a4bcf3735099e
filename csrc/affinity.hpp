// Remembers which actor last served each affinity key, forgetting the least recently used.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <utility>

namespace actormesh {

class AffinityTable {
 public:
  explicit AffinityTable(uint64_t capacity) : capacity_(capacity) {}

  // The actor that last served `key`, without refreshing its recency.
  std::optional<uint32_t> find(uint64_t key) const {
    const auto it = index_.find(key);
    if (it == index_.end()) return std::nullopt;
    return it->second->second;
  }

  // Records `actor` as the key's actor and makes the key the most recently used; beyond the
  // capacity the least recently used key is forgotten.
  void assign(uint64_t key, uint32_t actor) {
    const auto it = index_.find(key);
    if (it != index_.end()) {
      it->second->second = actor;
      order_.splice(order_.begin(), order_, it->second);
      return;
    }
    if (capacity_ == 0) return;
    if (index_.size() == capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
    order_.emplace_front(key, actor);
    index_.emplace(key, order_.begin());
  }

 private:
  using Entry = std::pair<uint64_t, uint32_t>;  // key, actor

  std::list<Entry> order_;  // most recently used first
  std::unordered_map<uint64_t, std::list<Entry>::iterator> index_;
  uint64_t capacity_;
};

}  // namespace actormesh
