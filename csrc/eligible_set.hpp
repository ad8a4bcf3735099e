// Which members of a group can take a call, with order statistics for uniform random picks.
#pragma once

#include <cstdint>
#include <vector>

namespace actormesh {

// A Fenwick tree over member positions holding 1 for every eligible member. `select(k)` finds the
// k-th eligible member in rank order in O(log N), which keeps "k-th eligible, k uniform" exact
// (and identical to the Python reference) without a linear scan when some members are full.
class EligibleSet {
 public:
  explicit EligibleSet(uint32_t size) : tree_(size + 1, 0) {
    while ((top_bit_ << 1) <= size) top_bit_ <<= 1;
  }

  void insert(uint32_t pos) { add(pos, 1); }
  void erase(uint32_t pos) { add(pos, -1); }

  // Number of eligible positions before `pos`.
  uint32_t count_before(uint32_t pos) const {
    int32_t sum = 0;
    for (uint32_t i = pos; i > 0; i -= i & (~i + 1)) sum += tree_[i];
    return static_cast<uint32_t>(sum);
  }

  // Position of the k-th (from 0) eligible member; k must be below the eligible count.
  uint32_t select(uint32_t k) const {
    uint32_t pos = 0;
    int32_t remaining = static_cast<int32_t>(k);
    for (uint32_t step = top_bit_; step > 0; step >>= 1) {
      const uint32_t next = pos + step;
      if (next < tree_.size() && tree_[next] <= remaining) {
        pos = next;
        remaining -= tree_[next];
      }
    }
    return pos;  // tree index pos + 1 is the answer; as a 0-based position that is pos
  }

 private:
  void add(uint32_t pos, int32_t delta) {
    for (uint32_t i = pos + 1; i < tree_.size(); i += i & (~i + 1)) tree_[i] += delta;
  }

  std::vector<int32_t> tree_;  // 1-based Fenwick tree
  uint32_t top_bit_ = 1;
};

}  // namespace actormesh
