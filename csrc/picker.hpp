// The callback behind the `external` policy. The core sees plain vectors, never a Python object.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace actormesh {

// The eligible members of a group, in rank order, as the picker sees them, and the call being
// placed: its affinity key and the payload the caller submitted it with (0 if none).
struct Candidates {
  const std::vector<uint32_t>& ranks;
  const std::vector<uint32_t>& in_flight;
  const std::vector<double>& mean_latency_s;  // NaN where never measured
  std::optional<uint64_t> affinity;
  uint64_t payload;
};

// Returns an index into the candidate lists. It may throw; the scheduler validates the index.
using Picker = std::function<int64_t(const Candidates&)>;

}  // namespace actormesh
