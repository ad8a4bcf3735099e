// `random`: a uniformly random eligible member (the baseline of Ray's prototype and Monarch).
#pragma once

#include "policy.hpp"

namespace actormesh {

class RandomPolicy final : public RankOrderPolicy {
 public:
  using RankOrderPolicy::RankOrderPolicy;

  // One draw when there is a choice, none when a single member is eligible.
  uint32_t pick(const PickContext& ctx) override {
    return kth(ctx, ctx.eligible == 1 ? 0 : ctx.rng.below(ctx.eligible));
  }
};

}  // namespace actormesh
