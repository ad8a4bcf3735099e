// The scheduler's core: construction, argument checks, what every group knows of an actor
// (its standing, kept in step by `changed`), methods' service times, and the views of the load
// table. Each other concept has its own file:
//   scheduler_groups.cpp    groups (meshes and views) and their reuse
//   scheduler_queue.cpp     the queue and the slots: submit, choose, drain, complete, release
//   scheduler_batches.cpp   coalescing, batch sizing and backlog pipelining
//   scheduler_holds.cpp     stragglers: holding calls back from them, and hedged copies
//   scheduler_failures.cpp  liveness and outlier ejection
//   scheduler_drivers.cpp   the load of other drivers (shared_load.hpp)
#include "scheduler.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

namespace actormesh {

Scheduler::Scheduler(int64_t num_actors, Settings settings)
    : settings_(validated(std::move(settings), num_actors)),
      policy_{parse_policy(settings_.policy), settings_.prior_s, &settings_.picker},
      loads_(static_cast<uint32_t>(num_actors),
             static_cast<uint32_t>(settings_.max_in_flight),
             TaskLimits{static_cast<uint32_t>(settings_.max_tasks), settings_.pipeline_s},
             settings_.ewma_alpha, settings_.prior_s),
      rng_(settings_.seed),
      affinity_(static_cast<uint64_t>(settings_.affinity_capacity)),
      memberships_(loads_.size()),
      ejections_(loads_.size(), Ejections{0, 0}) {
  std::vector<int64_t> everyone(loads_.size());
  for (uint32_t actor = 0; actor < loads_.size(); ++actor) everyone[actor] = actor;
  add_group(everyone);
}

uint32_t Scheduler::check_actor(int64_t actor) const {
  if (actor < 0 || actor >= loads_.size()) {
    throw std::out_of_range("actor " + std::to_string(actor) + " out of range for " +
                            std::to_string(loads_.size()) + " actors");
  }
  return static_cast<uint32_t>(actor);
}

uint32_t Scheduler::check_group(int64_t group) const {
  // A freed group is Group{}; one removed with calls still queued keeps its members until then.
  if (group < 0 || static_cast<uint64_t>(group) >= groups_.size() ||
      groups_[static_cast<size_t>(group)].members.empty()) {
    throw std::out_of_range("group " + std::to_string(group) + " unknown (" +
                            std::to_string(groups_.size() - free_ids_.size()) +
                            " groups registered)");
  }
  return static_cast<uint32_t>(group);
}

bool Scheduler::is_member(uint32_t group, uint32_t actor) const {
  for (const Membership& m : memberships_[actor]) {
    if (m.group == group) return true;
  }
  return false;
}

Scheduler::Standing Scheduler::standing(uint32_t actor) const {
  const ActorLoad& load = loads_[actor];
  const bool rated = load.alive() && !load.ejected && load.known();
  return {load.in_flight, load.live(), loads_.eligible(actor), loads_.preferred(actor),
          load.alive() && !load.ejected, rated,
          rated ? 1.0 / std::max(load.low_s, kMinTime) : 0.0,
          rated ? 1.0 / std::max(load.ewma_s, kMinTime) : 0.0};
}

void Scheduler::changed(uint32_t actor, const Standing& before) {
  const Standing now = standing(actor);
  for (const Membership& m : memberships_[actor]) {
    Group& g = groups_[m.group];
    // Add before remove: the histogram then finds a new minimum in one step.
    if (now.preferred) g.preferred_loads.add(now.in_flight);
    if (before.preferred) g.preferred_loads.remove(before.in_flight);
    g.live += static_cast<uint32_t>(now.live) - static_cast<uint32_t>(before.live);
    g.eligible += static_cast<uint32_t>(now.eligible) - static_cast<uint32_t>(before.eligible);
    g.preferred += static_cast<uint32_t>(now.preferred) - static_cast<uint32_t>(before.preferred);
    g.healthy += static_cast<uint32_t>(now.healthy) - static_cast<uint32_t>(before.healthy);
    g.rated += static_cast<uint32_t>(now.rated) - static_cast<uint32_t>(before.rated);
    // Kept incrementally (the reference does the same operations in the same order, so both
    // round alike), and exact again whenever nobody is rated.
    g.rate = g.rated == 0 ? 0.0 : g.rate + (now.rate - before.rate);
    g.pace = g.rated == 0 ? 0.0 : g.pace + (now.pace - before.pace);
    g.policy->update(loads_, m.pos, actor, before.preferred, now.preferred);
  }
}

Scheduler::Others Scheduler::others_of(const Group& group, uint32_t actor) const {
  const Standing s = standing(actor);
  return {group.rated - static_cast<uint32_t>(s.rated), group.rate - s.rate, group.pace - s.pace};
}

void Scheduler::add_load(uint32_t actor, int32_t calls, int32_t tasks) {
  const Standing before = standing(actor);
  loads_.add(actor, calls, tasks);
  changed(actor, before);
}

void Scheduler::see_time(double now_s) {
  if (now_s > clock_) clock_ = now_s;  // NaN: unknown, no change
}

uint32_t Scheduler::add_method(bool alone) {
  std::lock_guard<std::mutex> lock(mutex_);
  return loads_.add_method(alone);
}

uint32_t Scheduler::check_method(int64_t method) const {
  if (method < 0 || method >= loads_.num_methods()) {
    throw std::out_of_range("method " + std::to_string(method) + " unknown (" +
                            std::to_string(loads_.num_methods()) + " methods registered)");
  }
  return static_cast<uint32_t>(method);
}

double Scheduler::method_latency_s(int64_t method) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const MethodLoad& m = loads_.method(check_method(method));
  return m.measured ? m.ewma_s : std::numeric_limits<double>::quiet_NaN();
}

double Scheduler::method_quantile_s(int64_t method, double q) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint32_t id = check_method(method);
  if (!(q > 0.0 && q <= 1.0)) {
    throw std::invalid_argument("quantile " + format_double(q) + ": must be in (0, 1]");
  }
  return loads_.method(id).recent.quantile(q);
}

std::vector<Scheduler::ActorState> Scheduler::snapshot() {
  std::lock_guard<std::mutex> lock(mutex_);
  learn_others(true);
  std::vector<ActorState> out(loads_.size());
  for (uint32_t a = 0; a < loads_.size(); ++a) {
    const ActorLoad& load = loads_[a];
    out[a] = {load.own, load.tasks,
              load.measured ? load.ewma_s : std::numeric_limits<double>::quiet_NaN(),
              load.status, load.ejected, load.others};
  }
  return out;
}

std::vector<uint32_t> Scheduler::tasks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<uint32_t> out(loads_.size());
  for (uint32_t a = 0; a < loads_.size(); ++a) out[a] = loads_[a].tasks;
  return out;
}

std::vector<uint32_t> Scheduler::in_flight() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<uint32_t> out(loads_.size());
  for (uint32_t a = 0; a < loads_.size(); ++a) out[a] = loads_[a].own;
  return out;
}

std::vector<double> Scheduler::mean_latency_s() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<double> out(loads_.size());
  for (uint32_t a = 0; a < loads_.size(); ++a) {
    out[a] = loads_[a].measured ? loads_[a].ewma_s : std::numeric_limits<double>::quiet_NaN();
  }
  return out;
}

std::vector<bool> Scheduler::alive() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<bool> out(loads_.size());
  for (uint32_t a = 0; a < loads_.size(); ++a) out[a] = loads_[a].alive();
  return out;
}

std::vector<Status> Scheduler::status() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Status> out(loads_.size());
  for (uint32_t a = 0; a < loads_.size(); ++a) out[a] = loads_[a].status;
  return out;
}

std::vector<bool> Scheduler::ejected() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<bool> out(loads_.size());
  for (uint32_t a = 0; a < loads_.size(); ++a) out[a] = loads_[a].ejected;
  return out;
}

std::vector<Scheduler::Ejections> Scheduler::ejections() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return ejections_;
}

uint64_t Scheduler::queued() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return queued_.size();
}

}  // namespace actormesh
