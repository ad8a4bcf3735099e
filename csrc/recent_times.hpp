// The latest service-time samples of one method, and a high percentile of them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace actormesh {

// A ring of the last kSize samples. The percentile is the exact order statistic of the
// samples held (the ceil(q * n)-th smallest), computed on demand and kept until the next sample:
// a burst of hedged calls asks for it once per sample, not once per call.
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
    cached_q_ = -1.0;
  }

  size_t size() const { return samples_.size(); }

  // The q-quantile (0 < q <= 1) of the samples held; NaN with fewer than kEnough.
  double quantile(double q) const {
    if (samples_.size() < kEnough) return std::numeric_limits<double>::quiet_NaN();
    if (q != cached_q_) {
      scratch_ = samples_;
      const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(scratch_.size())));
      const size_t k = std::clamp<size_t>(rank, 1, scratch_.size()) - 1;
      std::nth_element(scratch_.begin(), scratch_.begin() + static_cast<std::ptrdiff_t>(k),
                       scratch_.end());
      cached_ = scratch_[k];
      cached_q_ = q;
    }
    return cached_;
  }

 private:
  std::vector<double> samples_;
  size_t next_ = 0;  // where the next sample goes once the ring is full
  mutable std::vector<double> scratch_;
  mutable double cached_ = 0.0;
  mutable double cached_q_ = -1.0;  // the quantile `cached_` holds; -1: none
};

}  // namespace actormesh
