// `sed`: shortest expected delay, (in_flight + 1) x mean service time.
#pragma once

#include "indexed_heap.hpp"
#include "policy.hpp"

namespace actormesh {

// Measured and unmeasured members live in separate heaps. Unmeasured members all share the prior,
// which moves with every sample when it is the mean of measured EWMAs; keyed by in_flight alone
// their order does not depend on it, so a new sample never re-keys them. A pick compares the two
// heap tops, lowest rank on equal delay.
class SedPolicy final : public Policy {
 public:
  SedPolicy(uint32_t size, double prior_s) : measured_(size), unmeasured_(size), prior_s_(prior_s) {}

  void update(const LoadTable& loads, uint32_t pos, uint32_t actor, bool,
              bool eligible) override {
    const ActorLoad& load = loads[actor];
    if (!eligible) {
      measured_.erase(pos);
      unmeasured_.erase(pos);
    } else if (load.measured) {
      unmeasured_.erase(pos);
      measured_.set(pos, (load.in_flight + 1.0) * load.ewma_s);
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
    const double u_delay = (u.key + 1.0) * prior;
    return m.key < u_delay || (m.key == u_delay && m.pos < u.pos) ? m.pos : u.pos;
  }

 private:
  IndexedHeap<double> measured_;      // key: (in_flight + 1) * ewma_s
  IndexedHeap<uint32_t> unmeasured_;  // key: in_flight
  double prior_s_;
};

}  // namespace actormesh
