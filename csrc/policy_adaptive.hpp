// `adaptive`, the default: a central queue, few Ray tasks per actor, the least loaded free actor,
// the faster one first.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "policy_least_loaded.hpp"

namespace actormesh {

// An actor's speed class: floor(log2) of its service time (`low_s`, robust to a few long
// calls), so that actors within a factor of two of each other mostly share a class and the
// next tie-break decides; INT_MIN while its speed is not known (unmeasured, or one sample that
// may include start-up): an actor never measured is tried first.
inline int speed_class(const ActorLoad& load) {
  return load.known() ? std::ilogb(std::max(load.low_s, kMinTime))
                      : std::numeric_limits<int>::min();
}

using AdaptiveKey = std::tuple<uint32_t, int, uint64_t>;

// Calls in flight, then the speed class (faster first), then recency: among idle actors the one
// most recently sent a task first, among busy ones the one least recently sent a task (it has
// worked longest on what it runs: it is the first expected to free).
inline AdaptiveKey adaptive_key(const ActorLoad& load) {
  const uint64_t recency = load.in_flight == 0
                               ? std::numeric_limits<uint64_t>::max() - load.last_task
                               : load.last_task;
  return {load.in_flight, speed_class(load), recency};
}

// The eligible member with the fewest calls in flight; among those, the fastest class, then, if
// idle, the one most recently sent a task (then the lowest rank), as `ray.util.ActorPool` takes
// its most recently freed actor: a process that has just run a call answers the next one faster
// than one that has slept (one call at a time on 4 actors here: 1.28x the latency when they
// take turns); if busy, the one expected to free first.
//
// What makes the policy adaptive lives in the load table and the scheduler, configured by the
// library for actors that run one call at a time: an actor is eligible only with a free task
// slot (one Ray task, and a second one waiting behind it only while the actor's calls are
// measured short or steady, so a call never waits long or unpredictably inside a busy actor);
// the calls that find no eligible actor wait in the group's FIFO queue, as with `pull`, and a
// freed slot takes them as one batch (coalescing); and a call is held back from a free
// straggler while a faster actor is expected to take and finish it sooner (Scheduler::holds).
using AdaptivePolicy = LeastKeyPolicy<AdaptiveKey, adaptive_key>;

}  // namespace actormesh
