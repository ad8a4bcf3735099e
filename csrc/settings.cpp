#include "settings.hpp"

#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

#include "policy.hpp"

namespace actormesh {

std::string format_double(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

Settings validated(Settings c, int64_t num_actors) {
  if (num_actors < 1 || num_actors > std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument("num_actors " + std::to_string(num_actors) + ": must be >= 1");
  }
  if (c.picker) {
    // The default policy name stands for "unspecified" when a picker is given.
    if (c.policy != "external" && c.policy != "pow2") {
      throw std::invalid_argument("policy '" + c.policy +
                                  "' with a picker: a picker makes the policy 'external'");
    }
    c.policy = "external";
  } else if (c.policy == "external") {
    throw std::invalid_argument("policy 'external' needs a picker");
  }
  const PolicyKind kind = parse_policy(c.policy);
  if (c.max_in_flight < 0 || c.max_in_flight > std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument("max_in_flight " + std::to_string(c.max_in_flight) +
                                ": must be >= 0 (0 = unbounded)");
  }
  if (kind == PolicyKind::pull && c.max_in_flight == 0) c.max_in_flight = 1;
  if (c.max_tasks < 0 || c.max_tasks > std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument("max_tasks " + std::to_string(c.max_tasks) +
                                ": must be >= 0 (0 = unbounded)");
  }
  if (!(c.pipeline_s >= 0.0 && std::isfinite(c.pipeline_s))) {
    throw std::invalid_argument("pipeline_s " + format_double(c.pipeline_s) +
                                ": must be finite and >= 0");
  }
  if (c.coalesce < 1 || c.coalesce > std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument("coalesce " + std::to_string(c.coalesce) +
                                ": must be >= 1 (1 = every call alone)");
  }
  if (!(c.hold_ratio >= 0.0 && std::isfinite(c.hold_ratio))) {
    throw std::invalid_argument("hold_ratio " + format_double(c.hold_ratio) +
                                ": must be finite and >= 0 (0 = never hold a call back)");
  }
  if (!(c.batch_budget_s > 0.0 && std::isfinite(c.batch_budget_s))) {
    throw std::invalid_argument("batch_budget_s " + format_double(c.batch_budget_s) +
                                ": must be finite and > 0");
  }
  if (!(c.ewma_alpha > 0.0 && c.ewma_alpha <= 1.0)) {
    throw std::invalid_argument("ewma_alpha " + format_double(c.ewma_alpha) +
                                ": must be in (0, 1]");
  }
  if (!(c.prior_s >= 0.0 && std::isfinite(c.prior_s))) {
    throw std::invalid_argument("prior_s " + format_double(c.prior_s) +
                                ": must be finite and >= 0");
  }
  if (c.affinity_abs < 0 || c.affinity_abs > std::numeric_limits<uint32_t>::max()) {
    throw std::invalid_argument("affinity_abs " + std::to_string(c.affinity_abs) +
                                ": must be >= 0");
  }
  if (!(c.affinity_rel >= 0.0 && std::isfinite(c.affinity_rel))) {
    throw std::invalid_argument("affinity_rel " + format_double(c.affinity_rel) +
                                ": must be finite and >= 0");
  }
  if (c.eject_after < 0 || c.eject_after > std::numeric_limits<uint32_t>::max()) {
    throw std::invalid_argument("eject_after " + std::to_string(c.eject_after) +
                                ": must be >= 0 (0 = never eject)");
  }
  if (!(c.eject_base_s > 0.0 && std::isfinite(c.eject_base_s)) ||
      !(c.eject_max_s >= c.eject_base_s && std::isfinite(c.eject_max_s))) {
    throw std::invalid_argument("eject_base_s " + format_double(c.eject_base_s) +
                                ", eject_max_s " + format_double(c.eject_max_s) +
                                ": need 0 < base <= max, both finite");
  }
  if (c.affinity_capacity < 0) {
    throw std::invalid_argument("affinity_capacity " + std::to_string(c.affinity_capacity) +
                                ": must be >= 0");
  }
  return c;
}

}  // namespace actormesh
