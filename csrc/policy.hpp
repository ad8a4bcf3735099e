// The interface every balancing policy implements, one instance per group.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "eligible_set.hpp"
#include "load_table.hpp"
#include "picker.hpp"
#include "rng.hpp"

namespace actormesh {

enum class PolicyKind { random, round_robin, pow2, least_loaded, pull, sed, adaptive, external };

// What a policy may look at when it picks. Only called when at least one member is preferred
// (eligible and not ejected), except for the external policy, which is also asked to pick among
// the eligible members when every one of them is ejected (`fallback`).
struct PickContext {
  const LoadTable& loads;
  const std::vector<uint32_t>& members;  // the group's actors, ascending rank
  uint32_t eligible;                     // how many members are candidates, >= 1
  SplitMix64& rng;
  std::optional<uint64_t> affinity;
  bool fallback = false;                 // candidates: eligible members, ejected ones included
  uint64_t payload = 0;                  // the caller's handle on the call (external policy)
};

// A policy keeps whatever index it needs over one group's members (positions into `members`)
// and picks an eligible position from it.
class Policy {
 public:
  virtual ~Policy() = default;

  // Member `pos` (actor `actor`) changed its in_flight, EWMA, liveness or ejection; also called
  // once per member when the group is created, with was_eligible false. "Eligible" here means
  // preferred: alive, with a free slot, and not ejected.
  virtual void update(const LoadTable& loads, uint32_t pos, uint32_t actor, bool was_eligible,
                      bool eligible) = 0;

  // The position of the eligible member that gets the next call.
  virtual uint32_t pick(const PickContext& ctx) = 0;
};

// Base of the policies that choose "the k-th eligible member in rank order" (random, round robin,
// pow2): they only need to know who is eligible, which changes far less often than loads.
class RankOrderPolicy : public Policy {
 public:
  explicit RankOrderPolicy(uint32_t size) : eligible_(size) {}

  void update(const LoadTable&, uint32_t pos, uint32_t, bool was_eligible,
              bool eligible) override {
    if (eligible && !was_eligible) eligible_.insert(pos);
    if (was_eligible && !eligible) eligible_.erase(pos);
  }

 protected:
  // Position of the k-th eligible member; when every member is eligible that is k itself.
  uint32_t kth(const PickContext& ctx, uint32_t k) const {
    return ctx.eligible == ctx.members.size() ? k : eligible_.select(k);
  }

  // Number of eligible members before position `pos`.
  uint32_t eligible_before(const PickContext& ctx, uint32_t pos) const {
    return ctx.eligible == ctx.members.size() ? pos : eligible_.count_before(pos);
  }

 private:
  EligibleSet eligible_;
};

struct PolicySettings {
  PolicyKind kind;
  double prior_s;        // sed: service time assumed for unmeasured actors; 0 = mean of measured
  const Picker* picker;  // external: owned by the scheduler, outlives every group
};

// Parses a policy name; throws std::invalid_argument naming it when unknown.
PolicyKind parse_policy(const std::string& name);
std::unique_ptr<Policy> make_policy(const PolicySettings& settings, uint32_t size);

}  // namespace actormesh
