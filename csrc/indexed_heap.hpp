// A binary min-heap over member positions whose keys can change in place.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

namespace actormesh {

// Orders entries by (key, position). Positions are indices into a group's members, which are in
// rank order, so equal keys go to the lowest rank. `where_` maps a position to its heap slot so
// a key update or removal costs O(log N) instead of a search.
template <typename Key>
class IndexedHeap {
 public:
  struct Entry {
    Key key;
    uint32_t pos;
  };

  explicit IndexedHeap(uint32_t size) : where_(size, kAbsent) {}

  bool empty() const { return heap_.empty(); }
  const Entry& top() const { return heap_.front(); }

  // Inserts `pos` or changes its key.
  void set(uint32_t pos, Key key) {
    uint32_t slot = where_[pos];
    if (slot == kAbsent) {
      slot = static_cast<uint32_t>(heap_.size());
      heap_.push_back({key, pos});
      where_[pos] = slot;
      sift_up(slot);
      return;
    }
    const bool decreased = key < heap_[slot].key;
    heap_[slot].key = key;
    if (decreased) {
      sift_up(slot);
    } else {
      sift_down(slot);
    }
  }

  // Removes `pos` if present.
  void erase(uint32_t pos) {
    const uint32_t slot = where_[pos];
    if (slot == kAbsent) return;
    where_[pos] = kAbsent;
    const Entry moved = heap_.back();
    heap_.pop_back();
    if (slot == heap_.size()) return;  // it was the last entry
    place(slot, moved);
    if (slot > 0 && less(moved, heap_[(slot - 1) / 2])) {
      sift_up(slot);
    } else {
      sift_down(slot);
    }
  }

 private:
  static constexpr uint32_t kAbsent = std::numeric_limits<uint32_t>::max();

  static bool less(const Entry& a, const Entry& b) {
    return a.key < b.key || (a.key == b.key && a.pos < b.pos);
  }

  void place(uint32_t slot, const Entry& entry) {
    heap_[slot] = entry;
    where_[entry.pos] = slot;
  }

  void sift_up(uint32_t slot) {
    const Entry entry = heap_[slot];
    while (slot > 0) {
      const uint32_t parent = (slot - 1) / 2;
      if (!less(entry, heap_[parent])) break;
      place(slot, heap_[parent]);
      slot = parent;
    }
    place(slot, entry);
  }

  void sift_down(uint32_t slot) {
    const Entry entry = heap_[slot];
    const uint32_t n = static_cast<uint32_t>(heap_.size());
    while (true) {
      uint32_t child = 2 * slot + 1;
      if (child >= n) break;
      if (child + 1 < n && less(heap_[child + 1], heap_[child])) ++child;
      if (!less(heap_[child], entry)) break;
      place(slot, heap_[child]);
      slot = child;
    }
    place(slot, entry);
  }

  std::vector<Entry> heap_;
  std::vector<uint32_t> where_;
};

}  // namespace actormesh
