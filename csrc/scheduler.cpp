#include "scheduler.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <utility>

namespace actormesh {

namespace {

std::string format_double(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

// Checks every setting and fills in the defaults that depend on the policy.
SchedulerConfig validated(SchedulerConfig c) {
  if (c.num_actors < 1 || c.num_actors > std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument("num_actors " + std::to_string(c.num_actors) + ": must be >= 1");
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
  if (c.affinity_capacity < 0) {
    throw std::invalid_argument("affinity_capacity " + std::to_string(c.affinity_capacity) +
                                ": must be >= 0");
  }
  return c;
}

}  // namespace

Scheduler::Scheduler(SchedulerConfig config)
    : config_(validated(std::move(config))),
      settings_{parse_policy(config_.policy), config_.prior_s, &config_.picker},
      loads_(static_cast<uint32_t>(config_.num_actors),
             static_cast<uint32_t>(config_.max_in_flight), config_.ewma_alpha, config_.prior_s),
      rng_(config_.seed),
      affinity_(static_cast<uint64_t>(config_.affinity_capacity)),
      memberships_(loads_.size()) {
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
  if (group < 0 || static_cast<uint64_t>(group) >= groups_.size()) {
    throw std::out_of_range("group " + std::to_string(group) + " unknown (" +
                            std::to_string(groups_.size()) + " groups registered)");
  }
  return static_cast<uint32_t>(group);
}

bool Scheduler::is_member(uint32_t group, uint32_t actor) const {
  for (const Membership& m : memberships_[actor]) {
    if (m.group == group) return true;
  }
  return false;
}

uint32_t Scheduler::add_group(const std::vector<int64_t>& members) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (members.empty()) throw std::invalid_argument("group members []: must not be empty");
  std::vector<uint32_t> sorted;
  sorted.reserve(members.size());
  for (int64_t actor : members) sorted.push_back(check_actor(actor));
  std::sort(sorted.begin(), sorted.end());
  const auto duplicate = std::adjacent_find(sorted.begin(), sorted.end());
  if (duplicate != sorted.end()) {
    throw std::invalid_argument("group members: actor " + std::to_string(*duplicate) +
                                " listed twice");
  }
  if (const auto known = group_ids_.find(sorted); known != group_ids_.end()) return known->second;

  const uint32_t id = static_cast<uint32_t>(groups_.size());
  const uint32_t size = static_cast<uint32_t>(sorted.size());
  Group group;
  group.policy = make_policy(settings_, size);
  for (uint32_t pos = 0; pos < size; ++pos) {
    const uint32_t actor = sorted[pos];
    const bool eligible = loads_.eligible(actor);
    if (loads_[actor].alive) ++group.alive;
    if (eligible) {
      ++group.eligible;
      group.eligible_loads.add(loads_[actor].in_flight);
    }
    group.policy->update(loads_, pos, actor, false, eligible);
    memberships_[actor].push_back({id, pos});
  }
  group.members = sorted;
  groups_.push_back(std::move(group));
  group_ids_.emplace(std::move(sorted), id);
  return id;
}

std::vector<uint32_t> Scheduler::group_members(int64_t group) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return groups_[check_group(group)].members;
}

void Scheduler::changed(uint32_t actor, uint32_t old_in_flight, bool was_eligible,
                        bool was_alive) {
  const ActorLoad& load = loads_[actor];
  const bool eligible = loads_.eligible(actor);
  for (const Membership& m : memberships_[actor]) {
    Group& g = groups_[m.group];
    // Add before remove: the histogram then finds a new minimum in one step.
    if (eligible) g.eligible_loads.add(load.in_flight);
    if (was_eligible) g.eligible_loads.remove(old_in_flight);
    if (eligible && !was_eligible) ++g.eligible;
    if (was_eligible && !eligible) --g.eligible;
    if (load.alive && !was_alive) ++g.alive;
    if (was_alive && !load.alive) --g.alive;
    g.policy->update(loads_, m.pos, actor, was_eligible, eligible);
  }
}

void Scheduler::dispatch(uint32_t actor) {
  const uint32_t old = loads_[actor].in_flight;
  const bool was_eligible = loads_.eligible(actor);
  loads_.increment(actor);
  changed(actor, old, was_eligible, loads_[actor].alive);
}

// An affinity key stays on its last actor while that actor is an eligible member whose load is
// not above the group's least loaded eligible member by more than affinity_abs calls AND by more
// than a factor affinity_rel (both, as SGLang's cache-aware router does).
bool Scheduler::sticks(uint32_t group, uint32_t actor) const {
  if (!loads_.eligible(actor) || !is_member(group, actor)) return false;
  const uint32_t load = loads_[actor].in_flight;
  const uint32_t least = groups_[group].eligible_loads.min();
  const bool overloaded = load - least > static_cast<uint64_t>(config_.affinity_abs) &&
                          load > config_.affinity_rel * least;
  return !overloaded;
}

// The group must have an eligible member. May throw only from an external picker, before any
// state other than the affinity table's recency has changed.
uint32_t Scheduler::choose(uint32_t group, std::optional<uint64_t> affinity) {
  if (affinity) {
    const std::optional<uint32_t> last = affinity_.find(*affinity);
    if (last && sticks(group, *last)) {
      affinity_.assign(*affinity, *last);
      return *last;
    }
  }
  Group& g = groups_[group];
  const uint32_t pos = g.policy->pick(PickContext{loads_, g.members, g.eligible, rng_, affinity});
  const uint32_t actor = g.members[pos];
  if (affinity) affinity_.assign(*affinity, actor);
  return actor;
}

Decision Scheduler::submit(int64_t group, std::optional<uint64_t> affinity) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint32_t id = check_group(group);
  Group& g = groups_[id];
  if (g.alive == 0) {
    throw NoLiveActors("no live actor among the " + std::to_string(g.members.size()) +
                       " actors of group " + std::to_string(id));
  }
  if (g.eligible == 0) {
    const uint64_t ticket = next_ticket_++;
    g.queue.push_back({ticket, affinity});
    queued_.emplace(ticket, QueuePlace{id, std::prev(g.queue.end())});
    return {ticket, -1};
  }
  const uint32_t actor = choose(id, affinity);
  dispatch(actor);
  return {next_ticket_++, static_cast<int32_t>(actor)};
}

// Hands queued calls to free slots until no group with a queue has an eligible member. Only the
// groups of `actor` can have gained one: every other group with a queue had no eligible member
// before this event and still has none. Among those groups the oldest ticket goes first.
Drain Scheduler::drain(uint32_t actor) {
  Drain out;
  while (!queued_.empty()) {
    uint32_t best = 0;
    const QueuedCall* oldest = nullptr;
    for (const Membership& m : memberships_[actor]) {
      const Group& g = groups_[m.group];
      if (g.eligible == 0 || g.queue.empty()) continue;
      if (oldest == nullptr || g.queue.front().ticket < oldest->ticket) {
        best = m.group;
        oldest = &g.queue.front();
      }
    }
    if (oldest == nullptr) return out;
    const QueuedCall call = *oldest;
    groups_[best].queue.pop_front();
    queued_.erase(call.ticket);
    uint32_t chosen;
    try {
      chosen = choose(best, call.affinity);
    } catch (...) {
      // Keeping the call queued would strand it (and the calls behind it) while slots are free:
      // nothing polls, and no later event may come. So it leaves the queue as failed.
      if (!out.error) out.error = std::current_exception();
      out.failed.push_back(call.ticket);
      continue;
    }
    dispatch(chosen);
    out.dispatched.push_back({call.ticket, static_cast<int32_t>(chosen)});
  }
  return out;
}

Drain Scheduler::complete(int64_t actor, double started_s, double ended_s, bool ok) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint32_t a = check_actor(actor);
  if (!std::isfinite(started_s) || !std::isfinite(ended_s)) {
    throw std::invalid_argument("complete(actor=" + std::to_string(a) + "): started_s " +
                                format_double(started_s) + ", ended_s " + format_double(ended_s) +
                                ": times must be finite");
  }
  const uint32_t old = loads_[a].in_flight;
  if (old == 0) {
    throw std::logic_error("complete(actor=" + std::to_string(a) +
                           "): no call in flight on actor " + std::to_string(a));
  }
  const bool was_eligible = loads_.eligible(a);
  loads_.decrement(a);
  loads_.record(a, started_s, ended_s, ok);
  changed(a, old, was_eligible, loads_[a].alive);
  return drain(a);
}

void Scheduler::acquire(int64_t actor) {
  std::lock_guard<std::mutex> lock(mutex_);
  dispatch(check_actor(actor));
}

bool Scheduler::cancel(uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = queued_.find(ticket);
  if (it == queued_.end()) return false;
  groups_[it->second.group].queue.erase(it->second.call);
  queued_.erase(it);
  return true;
}

std::vector<uint64_t> Scheduler::mark_dead(int64_t actor) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint32_t a = check_actor(actor);
  if (!loads_[a].alive) return {};
  const bool was_eligible = loads_.eligible(a);
  loads_.set_alive(a, false);
  changed(a, loads_[a].in_flight, was_eligible, true);
  std::vector<uint64_t> orphaned;
  for (const Membership& m : memberships_[a]) {
    Group& g = groups_[m.group];
    if (g.alive > 0) continue;
    for (const QueuedCall& call : g.queue) {
      orphaned.push_back(call.ticket);
      queued_.erase(call.ticket);
    }
    g.queue.clear();
  }
  std::sort(orphaned.begin(), orphaned.end());
  return orphaned;
}

Drain Scheduler::mark_alive(int64_t actor) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint32_t a = check_actor(actor);
  if (loads_[a].alive) return {};
  loads_.set_alive(a, true);
  changed(a, loads_[a].in_flight, false, false);
  return drain(a);
}

std::vector<uint32_t> Scheduler::in_flight() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<uint32_t> out(loads_.size());
  for (uint32_t a = 0; a < loads_.size(); ++a) out[a] = loads_[a].in_flight;
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
  for (uint32_t a = 0; a < loads_.size(); ++a) out[a] = loads_[a].alive;
  return out;
}

uint64_t Scheduler::queued() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return queued_.size();
}

}  // namespace actormesh
