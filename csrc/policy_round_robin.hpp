// `round_robin`: members in turn, skipping those that cannot take a call.
#pragma once

#include "policy.hpp"

namespace actormesh {

class RoundRobinPolicy final : public RankOrderPolicy {
 public:
  using RankOrderPolicy::RankOrderPolicy;

  // The first eligible member at or after the cursor, wrapping around; the cursor then moves
  // just past it.
  uint32_t pick(const PickContext& ctx) override {
    const uint32_t before = eligible_before(ctx, cursor_);
    const uint32_t pos = kth(ctx, before < ctx.eligible ? before : 0);
    cursor_ = pos + 1 == ctx.members.size() ? 0 : pos + 1;
    return pos;
  }

 private:
  uint32_t cursor_ = 0;
};

}  // namespace actormesh
