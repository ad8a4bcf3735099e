// `sed`: shortest expected delay, (in_flight + 1) x mean service time.
#pragma once

#include <utility>

#include "indexed_heap.hpp"
#include "policy.hpp"

namespace actormesh {

// The eligible member with the least (in_flight + 1) * ewma_s; ties go to fewer calls in flight,
// then to the lower rank. Unmeasured members use the prior: prior_s, or when that is 0 the mean
// EWMA of the measured actors (1.0 when none is measured).
//
// Measured and unmeasured members live in separate heaps. When the prior is the mean EWMA it moves
// with every sample; since all unmeasured members share it, their order is their in_flight order
// whatever its value, so a new sample never re-keys them. A pick compares the two heap tops.
class SedPolicy final : public Policy {
 public:
  SedPolicy(uint32_t size, double prior_s)
      : measured_(size), unmeasured_(size), prior_s_(prior_s) {}

  void update(const LoadTable& loads, uint32_t pos, uint32_t actor, bool,
              bool eligible) override {
    const ActorLoad& load = loads[actor];
    if (!eligible) {
      measured_.erase(pos);
      unmeasured_.erase(pos);
    } else if (load.measured) {
      unmeasured_.erase(pos);
      measured_.set(pos, {(load.in_flight + 1.0) * load.ewma_s, load.in_flight});
    } else {
      unmeasured_.set(pos, load.in_flight);
    }
  }

  uint32_t pick(const PickContext& ctx) override {
    if (unmeasured_.empty()) return measured_.top().pos;
    if (measured_.empty()) return unmeasured_.top().pos;
    const double prior = prior_s_ > 0.0 ? prior_s_ : ctx.loads.mean_ewma_or(1.0);
    const auto& m = measured_.top();
    const auto& u = unmeasured_.top();
    const Delay u_key{(u.key + 1.0) * prior, u.key};
    return m.key < u_key || (m.key == u_key && m.pos < u.pos) ? m.pos : u.pos;
  }

 private:
  using Delay = std::pair<double, uint32_t>;  // expected delay, then in_flight

  IndexedHeap<Delay> measured_;
  IndexedHeap<uint32_t> unmeasured_;  // key: in_flight
  double prior_s_;
};

}  // namespace actormesh
