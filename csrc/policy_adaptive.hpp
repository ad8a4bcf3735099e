// `adaptive`, the default: a central queue, few Ray tasks per actor, the least loaded free actor.
#pragma once

#include <utility>

#include "policy_least_loaded.hpp"

namespace actormesh {

// Calls in flight, then the measured service time (an unmeasured member first, so that it gets
// measured).
inline std::pair<uint32_t, double> calls_then_service_time(const ActorLoad& load) {
  return {load.in_flight, load.measured ? load.ewma_s : 0.0};
}

// The eligible member with the fewest calls in flight; among those, the one measured fastest,
// then the lowest rank.
//
// What makes the policy adaptive lives in the load table and the drain, configured by the
// library for actors that run one call at a time: an actor is eligible only with a free task
// slot (one Ray task, and a second one waiting behind it only while the actor's calls are
// measured short, so a slow call never queues inside a busy actor), the calls that find no
// eligible actor wait in the group's FIFO queue, as with `pull`, and a freed slot takes them as
// one batch (coalescing).
using AdaptivePolicy = LeastKeyPolicy<std::pair<uint32_t, double>, calls_then_service_time>;

}  // namespace actormesh
