// `pow2`: the power of two choices on in-flight counts.
#pragma once

#include "policy.hpp"

namespace actormesh {

class Pow2Policy final : public RankOrderPolicy {
 public:
  using RankOrderPolicy::RankOrderPolicy;

  // Two distinct eligible members drawn uniformly (the second draw skips the first's index);
  // the lower in_flight wins and a tie goes to the first draw, which is itself uniform, so ties
  // carry no rank bias. A single eligible member is taken without drawing.
  uint32_t pick(const PickContext& ctx) override {
    if (ctx.eligible == 1) return kth(ctx, 0);
    const uint32_t first = ctx.rng.below(ctx.eligible);
    uint32_t second = ctx.rng.below(ctx.eligible - 1);
    if (second >= first) ++second;
    const uint32_t a = kth(ctx, first);
    const uint32_t b = kth(ctx, second);
    return ctx.loads[ctx.members[b]].in_flight < ctx.loads[ctx.members[a]].in_flight ? b : a;
  }
};

}  // namespace actormesh
