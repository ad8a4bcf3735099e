// `least_loaded` (join the shortest queue) and `pull` (the same over single free slots).
#pragma once

#include "indexed_heap.hpp"
#include "policy.hpp"

namespace actormesh {

// The eligible member with the least `key_of(load)`, lowest rank on ties, from a heap that holds
// eligible members only: O(log N) per load change, O(1) per pick.
template <typename Key, Key (*key_of)(const ActorLoad&)>
class LeastKeyPolicy final : public Policy {
 public:
  explicit LeastKeyPolicy(uint32_t size) : heap_(size) {}

  void update(const LoadTable& loads, uint32_t pos, uint32_t actor, bool,
              bool eligible) override {
    if (eligible) {
      heap_.set(pos, key_of(loads[actor]));
    } else {
      heap_.erase(pos);
    }
  }

  uint32_t pick(const PickContext&) override { return heap_.top().pos; }

 private:
  IndexedHeap<Key> heap_;
};

inline uint32_t calls_in_flight(const ActorLoad& load) { return load.in_flight; }

// The eligible member with the fewest calls in flight. `pull` is this policy with
// max_in_flight defaulting to 1, so the group's FIFO queue is the central queue and a call leaves
// it only when an actor frees its slot. A prefetch of k calls (hiding the round trip between two
// calls on an actor) is max_in_flight = 1 + k, chosen by the caller.
using LeastLoadedPolicy = LeastKeyPolicy<uint32_t, calls_in_flight>;

}  // namespace actormesh
