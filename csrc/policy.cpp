#include "policy.hpp"

#include <stdexcept>

#include "policy_adaptive.hpp"
#include "policy_external.hpp"
#include "policy_least_loaded.hpp"
#include "policy_pow2.hpp"
#include "policy_random.hpp"
#include "policy_round_robin.hpp"
#include "policy_sed.hpp"

namespace actormesh {

namespace {

struct NamedPolicy {
  const char* name;
  PolicyKind kind;
};

constexpr NamedPolicy kPolicies[] = {
    {"random", PolicyKind::random},   {"round_robin", PolicyKind::round_robin},
    {"pow2", PolicyKind::pow2},       {"least_loaded", PolicyKind::least_loaded},
    {"pull", PolicyKind::pull},       {"sed", PolicyKind::sed},
    {"adaptive", PolicyKind::adaptive}, {"external", PolicyKind::external},
};

}  // namespace

PolicyKind parse_policy(const std::string& name) {
  for (const NamedPolicy& p : kPolicies) {
    if (name == p.name) return p.kind;
  }
  throw std::invalid_argument("policy '" + name +
                              "': expected one of random, round_robin, pow2, least_loaded, pull, "
                              "sed, adaptive, external");
}

std::unique_ptr<Policy> make_policy(const PolicySettings& settings, uint32_t size) {
  switch (settings.kind) {
    case PolicyKind::random:
      return std::make_unique<RandomPolicy>(size);
    case PolicyKind::round_robin:
      return std::make_unique<RoundRobinPolicy>(size);
    case PolicyKind::pow2:
      return std::make_unique<Pow2Policy>(size);
    case PolicyKind::least_loaded:
    case PolicyKind::pull:
      return std::make_unique<LeastLoadedPolicy>(size);
    case PolicyKind::sed:
      return std::make_unique<SedPolicy>(size, settings.prior_s);
    case PolicyKind::adaptive:
      return std::make_unique<AdaptivePolicy>(size);
    case PolicyKind::external:
      return std::make_unique<ExternalPolicy>(settings.picker);
  }
  throw std::logic_error("unhandled policy kind");
}

}  // namespace actormesh
