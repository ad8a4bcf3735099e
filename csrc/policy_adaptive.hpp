// `adaptive`, the default: a central queue, few Ray tasks per actor, the least loaded free actor.
#pragma once

#include <utility>

#include "indexed_heap.hpp"
#include "policy.hpp"

namespace actormesh {

// The eligible member with the fewest calls in flight; among those, the one measured fastest
// (an unmeasured member first, so that it gets measured), then the lowest rank.
//
// What makes the policy adaptive lives in the load table and the drain, configured by the
// library for actors that run one call at a time: an actor is eligible only with a free task
// slot (one Ray task, and a second one waiting behind it only while the actor's calls are
// measured short, so a slow call never queues inside a busy actor), the calls that find no
// eligible actor wait in the group's FIFO queue, as with `pull`, and a freed slot takes them as
// one batch (coalescing).
class AdaptivePolicy final : public Policy {
 public:
  explicit AdaptivePolicy(uint32_t size) : heap_(size) {}

  void update(const LoadTable& loads, uint32_t pos, uint32_t actor, bool,
              bool eligible) override {
    if (!eligible) {
      heap_.erase(pos);
      return;
    }
    const ActorLoad& load = loads[actor];
    heap_.set(pos, {load.in_flight, load.measured ? load.ewma_s : 0.0});
  }

  uint32_t pick(const PickContext&) override { return heap_.top().pos; }

 private:
  IndexedHeap<std::pair<uint32_t, double>> heap_;  // (in_flight, service time), eligible only
};

}  // namespace actormesh
