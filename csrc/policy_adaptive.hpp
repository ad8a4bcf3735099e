// `adaptive`, the default: a central queue, few Ray tasks per actor, the least loaded free actor.
#pragma once

#include <utility>

#include "policy_least_loaded.hpp"

namespace actormesh {

// Calls in flight, then when the actor was last sent a task.
inline std::pair<uint32_t, uint64_t> calls_then_last_task(const ActorLoad& load) {
  return {load.in_flight, load.last_task};
}

// The eligible member with the fewest calls in flight; among those, the one least recently sent
// a task (then the lowest rank): idle actors take turns, so their estimates stay fresh and a
// restarted or new actor gets its share at once.
//
// What makes the policy adaptive lives in the load table and the drain, configured by the
// library for actors that run one call at a time: an actor is eligible only with a free task
// slot (one Ray task, and a second one waiting behind it only while the actor's calls are
// measured short, so a slow call never queues inside a busy actor), the calls that find no
// eligible actor wait in the group's FIFO queue, as with `pull`, and a freed slot takes them as
// one batch (coalescing).
using AdaptivePolicy = LeastKeyPolicy<std::pair<uint32_t, uint64_t>, calls_then_last_task>;

}  // namespace actormesh
