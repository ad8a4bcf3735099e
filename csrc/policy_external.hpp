// `external`: a caller-supplied picker chooses among the eligible members.
#pragma once

#include <limits>
#include <stdexcept>
#include <string>

#include "policy.hpp"

namespace actormesh {

// The picker sees every preferred member (every eligible one when all are ejected), so a pick
// is O(N) by nature; no index is kept.
class ExternalPolicy final : public Policy {
 public:
  explicit ExternalPolicy(const Picker* picker) : picker_(picker) {}

  void update(const LoadTable&, uint32_t, uint32_t, bool, bool) override {}

  // Throws whatever the picker throws, and std::invalid_argument naming a returned index that is
  // not a candidate.
  uint32_t pick(const PickContext& ctx) override {
    positions_.clear();
    ranks_.clear();
    in_flight_.clear();
    latency_.clear();
    for (uint32_t pos = 0; pos < ctx.members.size(); ++pos) {
      const uint32_t actor = ctx.members[pos];
      if (ctx.fallback ? !ctx.loads.eligible(actor) : !ctx.loads.preferred(actor)) continue;
      const ActorLoad& load = ctx.loads[actor];
      positions_.push_back(pos);
      ranks_.push_back(actor);
      in_flight_.push_back(load.in_flight);
      latency_.push_back(load.measured ? load.ewma_s : std::numeric_limits<double>::quiet_NaN());
    }
    const int64_t index =
        (*picker_)(Candidates{ranks_, in_flight_, latency_, ctx.affinity, ctx.payload});
    if (index < 0 || index >= static_cast<int64_t>(positions_.size())) {
      throw std::invalid_argument("picker returned index " + std::to_string(index) + " for " +
                                  std::to_string(positions_.size()) +
                                  " candidates (expected 0.." +
                                  std::to_string(positions_.size() - 1) + ")");
    }
    return positions_[static_cast<size_t>(index)];
  }

 private:
  const Picker* picker_;
  // Reused between picks to avoid reallocating.
  std::vector<uint32_t> positions_;
  std::vector<uint32_t> ranks_;
  std::vector<uint32_t> in_flight_;
  std::vector<double> latency_;
};

}  // namespace actormesh
