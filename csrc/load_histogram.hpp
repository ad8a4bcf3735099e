// The minimum in_flight over a group's eligible members, for the affinity escape test.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

namespace actormesh {

// Counts eligible members per in_flight value. Loads move by one per event, so when the last
// member at the minimum moves up the new minimum is found in the next bucket: O(1) per change
// when the caller adds the new value before removing the old one.
class LoadHistogram {
 public:
  void add(uint32_t in_flight) {
    if (in_flight >= counts_.size()) counts_.resize(in_flight + 1, 0);
    ++counts_[in_flight];
    ++total_;
    if (in_flight < min_) min_ = in_flight;
  }

  void remove(uint32_t in_flight) {
    --counts_[in_flight];
    if (--total_ == 0) {
      min_ = kEmpty;
      return;
    }
    while (counts_[min_] == 0) ++min_;
  }

  // Smallest in_flight among the counted members; the histogram must not be empty.
  uint32_t min() const { return min_; }

 private:
  static constexpr uint32_t kEmpty = std::numeric_limits<uint32_t>::max();

  std::vector<uint32_t> counts_;
  uint32_t total_ = 0;
  uint32_t min_ = kEmpty;
};

}  // namespace actormesh
