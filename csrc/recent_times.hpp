// The latest service-time samples of one method, and a high percentile of them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace actormesh {

// A ring of the last kSize samples. A percentile is the exact order statistic of the samples held
// (the ceil(q * n)-th smallest), read from a sorted copy made on demand and kept until the next
// sample: a burst of hedged calls sorts once per sample, not once per call, and the pipeline
// rule's two percentiles (Scheduler::pipeline_backlog) cost one sort between them.
class RecentTimes {
 public:
  static constexpr size_t kSize = 64;
  static constexpr size_t kEnough = 8;  // fewer samples than this tell no percentile

  void add(double sample) {
    if (samples_.size() < kSize) {
      samples_.push_back(sample);
    } else {
      samples_[next_] = sample;
    }
    next_ = (next_ + 1) % kSize;
    sorted_.clear();
  }

  size_t size() const { return samples_.size(); }

  // The q-quantile (0 < q <= 1) of the samples held; NaN with fewer than kEnough.
  double quantile(double q) const {
    if (samples_.size() < kEnough) return std::numeric_limits<double>::quiet_NaN();
    if (sorted_.empty()) {
      sorted_ = samples_;
      std::sort(sorted_.begin(), sorted_.end());
    }
    const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted_.size())));
    return sorted_[std::clamp<size_t>(rank, 1, sorted_.size()) - 1];
  }

 private:
  std::vector<double> samples_;
  size_t next_ = 0;  // where the next sample goes once the ring is full
  mutable std::vector<double> sorted_;  // the samples in order; empty: none since the last add
};

}  // namespace actormesh
