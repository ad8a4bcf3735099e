#include "scheduler.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "policy_adaptive.hpp"

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
  if (const auto known = group_ids_.find(sorted); known != group_ids_.end()) {
    Group& g = groups_[known->second];
    ++g.users;
    return known->second;
  }

  uint32_t id = static_cast<uint32_t>(groups_.size());
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
  }
  const uint32_t size = static_cast<uint32_t>(sorted.size());
  Group group;
  group.users = 1;
  group.policy = make_policy(policy_, size);
  for (uint32_t pos = 0; pos < size; ++pos) {
    const uint32_t actor = sorted[pos];
    const Standing now = standing(actor);
    group.live += now.live;
    group.eligible += now.eligible;
    group.healthy += now.healthy;
    group.rated += now.rated;
    group.rate += now.rate;
    group.pace += now.pace;
    if (now.preferred) {
      ++group.preferred;
      group.preferred_loads.add(now.in_flight);
    }
    group.policy->update(loads_, pos, actor, false, now.preferred);
    memberships_[actor].push_back({id, pos});
  }
  group.members = sorted;
  if (id == groups_.size()) {
    groups_.push_back(std::move(group));
  } else {
    groups_[id] = std::move(group);
  }
  group_ids_.emplace(std::move(sorted), id);
  return id;
}

void Scheduler::remove_group(int64_t group) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint32_t id = check_group(group);
  if (id == 0) throw std::invalid_argument("group 0 (every actor) cannot be removed");
  Group& g = groups_[id];
  if (g.users == 0) return;  // removed already; kept only for the calls still in its queue
  // Calls still queued need its members: then it goes when the last of them leaves the queue.
  if (--g.users == 0 && g.queue.empty()) free_group(id);
}

void Scheduler::free_if_unused(uint32_t group) {
  const Group& g = groups_[group];
  if (g.users == 0 && g.queue.empty() && !g.members.empty()) free_group(group);
}

// Drops a group: its members forget it, its id is reused. A group nobody uses costs nothing.
void Scheduler::free_group(uint32_t group) {
  Group& g = groups_[group];
  for (const uint32_t actor : g.members) {
    std::vector<Membership>& of_actor = memberships_[actor];
    of_actor.erase(std::remove_if(of_actor.begin(), of_actor.end(),
                                  [&](const Membership& m) { return m.group == group; }),
                   of_actor.end());
  }
  group_ids_.erase(g.members);
  g = Group{};
  free_ids_.push_back(group);
}

uint32_t Scheduler::num_groups() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<uint32_t>(groups_.size() - free_ids_.size());
}

std::vector<uint32_t> Scheduler::group_members(int64_t group) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return groups_[check_group(group)].members;
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

// An affinity key stays on its last actor while that actor is an eligible member whose load is
// not above the group's least loaded preferred member by more than affinity_abs calls AND by more
// than a factor affinity_rel (both, as SGLang's cache-aware router does). An ejected actor keeps
// its keys only while every live member is ejected.
bool Scheduler::sticks(uint32_t group, uint32_t actor) const {
  if (!loads_.eligible(actor) || !is_member(group, actor)) return false;
  const Group& g = groups_[group];
  if (g.preferred == 0) return g.healthy == 0;
  if (loads_[actor].ejected) return false;
  const uint32_t load = loads_[actor].in_flight;
  const uint32_t least = g.preferred_loads.min();
  const bool overloaded = load - least > static_cast<uint64_t>(settings_.affinity_abs) &&
                          load > settings_.affinity_rel * least;
  return !overloaded;
}

// The eligible member with the fewest calls in flight, lowest rank on ties: the choice when every
// eligible member is ejected. A scan, but only while a whole group keeps failing.
uint32_t Scheduler::least_loaded_eligible(const Group& group) const {
  uint32_t best = 0;
  uint32_t best_load = std::numeric_limits<uint32_t>::max();
  for (uint32_t pos = 0; pos < group.members.size(); ++pos) {
    const uint32_t actor = group.members[pos];
    if (loads_.eligible(actor) && loads_[actor].in_flight < best_load) {
      best = pos;
      best_load = loads_[actor].in_flight;
    }
  }
  return best;
}

// The actor for `call`, or nothing when it must wait though a member is eligible: every
// eligible member is ejected while a member that is not runs calls (its end will drain the
// queue: an actor that fails fast must not take a burst because the healthy ones are busy), or
// it is held back from a straggler (`holds`). `waiting` counts the calls waiting in the group,
// this one included. The group must have an eligible member.
// May throw only from an external picker, before any state other than the affinity table's
// recency has changed.
std::optional<uint32_t> Scheduler::choose(uint32_t group, const QueuedCall& call,
                                          uint64_t waiting) {
  const bool sticky = call.affinity && settings_.sticky;
  learn_others();
  if (sticky) {
    const std::optional<uint32_t> last = affinity_.find(*call.affinity);
    if (last && sticks(group, *last)) {
      affinity_.assign(*call.affinity, *last);
      return *last;
    }
  }
  Group& g = groups_[group];
  uint32_t pos;
  if (g.preferred > 0) {
    pos = g.policy->pick(PickContext{loads_, g.members, g.preferred, rng_, call.affinity, false,
                                     call.payload});
  } else if (g.healthy > 0) {
    return std::nullopt;
  } else if (policy_.kind == PolicyKind::external) {
    pos = g.policy->pick(PickContext{loads_, g.members, g.eligible, rng_, call.affinity, true,
                                     call.payload});
  } else {
    pos = least_loaded_eligible(g);
  }
  const uint32_t actor = g.members[pos];
  if (holds(group, actor, waiting)) return std::nullopt;
  if (sticky) affinity_.assign(*call.affinity, actor);
  return actor;
}

// The preferred member other than `exclude` that the adaptive order puts first (the fewest
// calls in flight, the fastest class, then recency); with `idle`, one with no call in flight.
// A scan, but only for hedged calls, and O(1) when an idle one is wanted and none is.
std::optional<uint32_t> Scheduler::free_member(uint32_t group, int64_t exclude,
                                               bool idle) const {
  const Group& g = groups_[group];
  if (g.preferred == 0 || (idle && g.preferred_loads.min() > 0)) return std::nullopt;
  std::optional<uint32_t> best;
  AdaptiveKey best_key{};
  for (const uint32_t actor : g.members) {
    if (actor == exclude || (idle && loads_[actor].in_flight > 0)) continue;
    if (!loads_.preferred(actor)) continue;
    const AdaptiveKey key = adaptive_key(loads_[actor]);
    if (!best || key < best_key) {
      best = actor;
      best_key = key;
    }
  }
  return best;
}

// Whether a call is held back from `actor`, the eligible member the policy picked: with
// `adaptive` over actors with task slots, while `actor` is a straggler (its service time over
// hold_ratio times the harmonic mean of the other members whose speed is known) and the
// other members are expected to take and finish the call sooner than `actor` would: through
// the `waiting` calls at their joint rate R, then one of their own service times,
// W = (waiting + others) / R < the straggler's time.
// The straggler's time is its estimate slow to rise (`low_s`), counted half as much for every
// kStaleTasksPerActor tasks per actor the mesh was sent since the straggler's last: one passed
// over is tried again now and then (sooner when the wait it spares is long), and being stale
// its next sample replaces its estimate, so a straggler that has recovered is seen at once.
// Its time rises slowly (a heavy tail's long calls must not make an actor look slow), so an
// actor that has just become a straggler would take a dozen calls to cross that bar, and then
// sit at it, let through whenever the bar moves. It is a straggler as well while each of its
// latest kLatest calls took over kAllSlow times the bar and kAboveMean times the others' mean
// time, and its time is over kFloor times the bar: every call slow is what sets it apart from a
// heavy tail, where only some are. (The others' mean time, not the bar alone: a driver that
// stalls delays every completion it sees, which lengthens every actor's latest samples at
// once, and their mean times with them, never the estimates slow to rise the bar is made of.)
// A hold never strands a call, and a wrong one (an actor that only looks slow, having run a
// slower method) costs little: it ends kPatience * W after it began, or once the straggler's
// time has passed if that is sooner, when no call has left the group's queue meanwhile (the
// faster actors may have hung).
bool Scheduler::holds(uint32_t group, uint32_t actor, uint64_t waiting) {
  constexpr double kPatience = 4.0;
  constexpr double kAllSlow = 2.0;
  constexpr double kFloor = 0.25;
  constexpr double kAboveMean = 3.0;
  if (!may_hold()) return false;
  const ActorLoad& a = loads_[actor];
  if (!a.known()) return false;
  Group& g = groups_[group];
  const auto [others, rate, pace] = others_of(g, actor);
  if (others == 0 || !(rate > 0.0)) return false;
  const double passed_over = static_cast<double>(loads_.age(actor)) / loads_.stale_after();
  const double time = std::max(a.low_s * std::pow(2.0, -passed_over), kMinTime);
  const double wait = static_cast<double>(waiting + others) / rate;
  const double bar = settings_.hold_ratio * others / rate;
  const bool straggler =
      time > bar || (time > kFloor * bar && pace > 0.0 &&
                     a.latest_floor_s() > std::max(kAllSlow * bar, kAboveMean * others / pace));
  if (!straggler || !(time > wait)) return false;
  if (!g.holding) {
    g.holding = true;
    g.hold_until = clock_ + std::min(time, kPatience * wait);
    earliest_hold_ = std::min(earliest_hold_, g.hold_until);
    return true;
  }
  return clock_ < g.hold_until;
}

bool Scheduler::may_hold() const {
  return settings_.hold_ratio > 0.0 && policy_.kind == PolicyKind::adaptive &&
         loads_.max_tasks() > 0;
}

// A call left `group`'s queue for an actor: a hold ends (the next first call starts its own).
void Scheduler::dispatched_from(uint32_t group) { groups_[group].holding = false; }

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

uint32_t Scheduler::batch_size(int64_t method) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const QueuedCall call{0, std::nullopt, 0, check_method(method), false};
  if (settings_.coalesce == 1 || !may_ride(call)) return 1;
  const double fits = std::floor(settings_.batch_budget_s / expected_s(call));
  return static_cast<uint32_t>(std::clamp(fits, 1.0, static_cast<double>(settings_.coalesce)));
}

Decision Scheduler::submit(int64_t group, std::optional<uint64_t> affinity, uint64_t payload,
                           double now_s, int64_t method, bool alone) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint32_t id = check_group(group);
  const uint32_t method_id = check_method(method);
  Group& g = groups_[id];
  if (g.live == 0) {
    throw NoLiveActors("no live actor among the " + std::to_string(g.members.size()) +
                       " actors of group " + std::to_string(id));
  }
  see_time(now_s);
  end_ejections(now_s);
  QueuedCall call{next_ticket_, affinity, payload, method_id, alone};
  // A call never overtakes the calls already waiting (their drain may be pending).
  std::optional<uint32_t> actor;
  if (g.eligible > 0 && g.queue.empty()) actor = choose(id, call, 1);
  ++next_ticket_;
  if (!actor) {
    g.queue.push_back(call);
    queued_.emplace(call.ticket, QueuePlace{id, std::prev(g.queue.end())});
    return {call.ticket, -1, payload};
  }
  add_load(*actor, 1, 1);
  return {call.ticket, static_cast<int32_t>(*actor), 0};
}

int32_t Scheduler::hedge(int64_t group, int64_t first, bool idle) {
  constexpr double kSlower = 2.0;
  std::lock_guard<std::mutex> lock(mutex_);
  const uint32_t id = check_group(group);
  const uint32_t running = check_actor(first);
  if (!groups_[id].queue.empty()) return -1;
  learn_others();  // an actor that looks idle may be busy with other drivers' calls
  const std::optional<uint32_t> target = free_member(id, running, idle);
  if (!target) return -1;
  const ActorLoad& to = loads_[*target];
  const ActorLoad& from = loads_[running];
  if (to.known() && from.known() && to.low_s > kSlower * from.low_s) return -1;
  add_load(*target, 1, 1);
  return static_cast<int32_t>(*target);
}

double Scheduler::hold_deadline_s() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return earliest_hold_;
}

Drain Scheduler::expire_holds(double now_s) {
  std::lock_guard<std::mutex> lock(mutex_);
  see_time(now_s);
  Drain out;
  for (uint32_t id = 0; id < groups_.size(); ++id) {
    Group& g = groups_[id];
    if (!g.holding || g.hold_until > clock_) continue;
    // A drain through any eligible member reaches the group.
    for (const uint32_t actor : g.members) {
      if (!loads_.eligible(actor)) continue;
      Drain more = drain_locked(actor);
      out.dispatched.insert(out.dispatched.end(), more.dispatched.begin(), more.dispatched.end());
      out.failed.insert(out.failed.end(), more.failed.begin(), more.failed.end());
      if (!out.error) out.error = more.error;
      break;
    }
    // With no member eligible (the straggler too was taken meanwhile) the hold is over all the
    // same: the held call waits for the next slot to free, and no timer is due for it.
    if (g.holding && g.hold_until <= clock_) g.holding = false;
  }
  earliest_hold_ = std::numeric_limits<double>::infinity();
  for (const Group& g : groups_) {
    if (g.holding) earliest_hold_ = std::min(earliest_hold_, g.hold_until);
  }
  return out;
}

// A call's expected service time, for the batch budget: its method's estimate; unmeasured, a
// share of the budget that keeps a new method's first batches small.
double Scheduler::expected_s(const QueuedCall& call) const {
  constexpr double kUnmeasuredBatch = 4.0;
  const MethodLoad& m = loads_.method(call.method);
  return m.measured ? m.ewma_s : settings_.batch_budget_s / kUnmeasuredBatch;
}

// Whether a queued call may ride a batch that another call opened. A keyed call whose keys a
// picker routes itself (no native stickiness) must reach the picker, so it goes alone too.
bool Scheduler::may_ride(const QueuedCall& call) const {
  return !call.alone && !loads_.method(call.method).alone &&
         (settings_.sticky || !call.affinity);
}

// Of `actor`'s groups with a queue that `accept` lets through, the one whose first call is the
// oldest (the lowest ticket); none if there is no such group.
template <class Accept>
std::optional<uint32_t> Scheduler::oldest_queue(uint32_t actor, Accept accept) const {
  std::optional<uint32_t> best;
  for (const Membership& m : memberships_[actor]) {
    const Group& g = groups_[m.group];
    if (g.queue.empty() || !accept(m.group)) continue;
    if (!best || g.queue.front().ticket < groups_[*best].queue.front().ticket) best = m.group;
  }
  return best;
}

// A backlog: this many queued calls per live member of a group. Every call there waits through
// several ends anyway: batching it with others, or sending it ahead (pipeline_backlog), costs
// it little and drains the queue sooner.
constexpr uint64_t kBacklog = 2;
// Neither is done for an actor measured over this many times slower than the group's others.
constexpr double kBacklogSlower = 2.0;
// Under a backlog a batch may be expected to take up to this many budgets.
constexpr double kBacklogBudgets = 8.0;

// Whether `actor` is measured no slower than kBacklogSlower times the other rated members of
// `group` (their harmonic mean): a straggler takes no more than it must.
bool Scheduler::not_slower(const Group& group, uint32_t actor) const {
  const Others o = others_of(group, actor);
  return o.count == 0 || loads_[actor].low_s * o.rate <= kBacklogSlower * o.count;
}

// The expected duration a task opened from `group`'s queue on `actor` may carry, and the calls
// it takes even beyond it. Normally batch_budget_s, and no minimum. Under a backlog of `group`
// (its first call included), with an actor not slower than the others, the budget grows with the
// backlog's depth, up to kBacklogBudgets times, and a task takes at least two calls: a method's
// estimate is measured on the driver and includes the round trip of each task, so once calls
// go one per task (after a phase of slow calls, a stall of the driver) their estimate would stay
// that of a task, and one call per task would be all that fits. Batches under a backlog carry
// that round trip over several calls, so the estimate can fall back to what a call takes.
Scheduler::Budget Scheduler::budget(uint32_t group, uint32_t actor) const {
  const Group& g = groups_[group];
  const double depth = static_cast<double>(g.queue.size() + 1) /
                       static_cast<double>(kBacklog * std::max(g.live, 1u));
  const ActorLoad& a = loads_[actor];
  if (depth < 1.0 || !a.known() || a.failures_in_a_row > 0 || !not_slower(g, actor)) {
    return {settings_.batch_budget_s, 1};
  }
  return {settings_.batch_budget_s * std::min(depth, kBacklogBudgets), 2};
}

// Coalescing: after `first` was dispatched from `group` to `actor` (the last decision in `out`),
// the calls that wait for `actor` (in any of its groups, oldest first) join its task while each
// may ride, the task holds fewer than `coalesce` calls, the actor has a free call slot, and the
// expected service times add up to the budget (or the task holds fewer calls than the budget's
// minimum). They stop at the first call that may not ride, so every queue still leaves in FIFO
// order. Ties between groups go to the oldest ticket, as in a drain.
void Scheduler::add_mates(uint32_t group, uint32_t actor, const QueuedCall& first, Drain& out) {
  if (settings_.coalesce == 1 || !may_ride(first)) return;
  const size_t opened = out.dispatched.size() - 1;
  const Budget allowed = budget(group, actor);
  double left = allowed.seconds - expected_s(first);
  while (out.dispatched[opened].calls < settings_.coalesce && loads_.has_call_slot(actor)) {
    const std::optional<uint32_t> found = oldest_queue(actor, [](uint32_t) { return true; });
    if (!found) return;
    const uint32_t from = *found;
    const QueuedCall* oldest = &groups_[from].queue.front();
    if (!may_ride(*oldest)) return;
    if (expected_s(*oldest) > left && out.dispatched[opened].calls >= allowed.calls) return;
    const QueuedCall mate = *oldest;
    left -= expected_s(mate);
    groups_[from].queue.pop_front();
    queued_.erase(mate.ticket);
    dispatched_from(from);
    free_if_unused(from);
    add_load(actor, 1, 0);
    if (mate.affinity && settings_.sticky) affinity_.assign(*mate.affinity, actor);
    out.dispatched.push_back({mate.ticket, static_cast<int32_t>(actor), mate.payload, 0});
    ++out.dispatched[opened].calls;
  }
}

// Hands queued calls to free slots until no group with a queue has an eligible member. Only the
// groups of `actor` can have gained one: every other group with a queue had no eligible member
// before this event and still has none. Among those groups the oldest ticket goes first.
Drain Scheduler::drain_locked(uint32_t actor) {
  Drain out;
  std::vector<uint32_t> waiting;  // groups whose first call waits though a member is eligible
  while (!queued_.empty()) {
    const std::optional<uint32_t> found = oldest_queue(actor, [&](uint32_t group) {
      return groups_[group].eligible > 0 &&
             std::find(waiting.begin(), waiting.end(), group) == waiting.end();
    });
    if (!found) break;
    const uint32_t best = *found;
    Group& g = groups_[best];
    const QueuedCall call = g.queue.front();
    g.queue.pop_front();
    queued_.erase(call.ticket);
    std::optional<uint32_t> chosen;
    try {
      chosen = choose(best, call, g.queue.size() + 1);
    } catch (...) {
      // Keeping the call queued would strand it (and the calls behind it) while slots are free:
      // nothing polls, and no later event may come. So it leaves the queue as failed.
      if (!out.error) out.error = std::current_exception();
      out.failed.push_back({call.ticket, -1, call.payload});
      free_if_unused(best);
      continue;
    }
    if (!chosen) {  // it waits, first in line still; the calls behind it wait with it
      g.queue.push_front(call);
      queued_.emplace(call.ticket, QueuePlace{best, g.queue.begin()});
      waiting.push_back(best);
      continue;
    }
    dispatch_queued(best, *chosen, call, out);
  }
  pipeline_backlog(actor, out);
  return out;
}

// Under a backlog, `actor`, which has just freed a task slot and taken the next call, takes a
// second one, to wait behind the first in the actor. Between two tasks a Ray actor idles for a
// round trip (its end reaches the driver, the next call travels back): ~1.3 ms against calls of
// 10 ms on the machines measured, so at 90% load the actors are in fact busy ~95% of the time
// and a backlog drains slowly. A call sent ahead starts the instant the one before it ends.
// What it costs: the call waits for that actor's call to end rather than for the first of any.
// So only under a backlog of twice the group's live members, where every call waits through
// several ends anyway and the round trips saved are what makes the queue drain sooner; not
// behind a heavy tail, where the call may wait for one long call: the queued method's recent
// times must have a 90th percentile within kTail times their median (exponential times: 3.3,
// ~3 with the round trip in the samples; lognormal with sigma 2: 13, ~7 with it; too few
// samples: no); nor behind a straggler: the actor must be measured no slower than kSlower times
// the others' harmonic mean. A call with an affinity key goes by its key, and an external
// picker sees every call: those wait as before, and the calls behind them too.
void Scheduler::pipeline_backlog(uint32_t actor, Drain& out) {
  constexpr double kTail = 5.0;
  if (!settings_.pipeline_backlog || policy_.kind == PolicyKind::external || queued_.empty()) {
    return;
  }
  const ActorLoad& a = loads_[actor];
  if (a.tasks != 1 || loads_.max_tasks() < 2 || !a.alive() || a.ejected || !a.known() ||
      !loads_.has_call_slot(actor)) {
    return;
  }
  const std::optional<uint32_t> found = oldest_queue(actor, [&](uint32_t group) {
    const Group& g = groups_[group];
    return !g.holding && g.queue.size() >= kBacklog * g.live;
  });
  if (!found) return;
  const uint32_t from = *found;
  Group& g = groups_[from];
  const QueuedCall* oldest = &g.queue.front();  // the first call of the oldest backlog
  if (oldest->affinity) return;
  if (!not_slower(g, actor)) return;
  const RecentTimes& recent = loads_.method(oldest->method).recent;
  if (!(recent.quantile(0.9) <= kTail * recent.quantile(0.5))) return;
  const QueuedCall call = *oldest;
  g.queue.pop_front();
  queued_.erase(call.ticket);
  dispatch_queued(from, actor, call, out);
}

// `call`, just taken out of `group`'s queue, opens a task on `actor`, with the calls that ride.
void Scheduler::dispatch_queued(uint32_t group, uint32_t actor, const QueuedCall& call,
                                Drain& out) {
  add_load(actor, 1, 1);
  dispatched_from(group);
  out.dispatched.push_back({call.ticket, static_cast<int32_t>(actor), call.payload});
  add_mates(group, actor, call, out);
  free_if_unused(group);
}

Drain Scheduler::drain(int64_t actor) {
  std::lock_guard<std::mutex> lock(mutex_);
  return drain_locked(check_actor(actor));
}

// Ejects `actor` once it has failed eject_after calls in a row (the back-off doubles with each
// ejection that no success interrupted).
void Scheduler::eject_if_due(uint32_t actor, double now_s) {
  const ActorLoad& load = loads_[actor];
  if (settings_.eject_after == 0 || load.ejected || !load.alive() ||
      load.failures_in_a_row < static_cast<uint64_t>(settings_.eject_after)) {
    return;
  }
  const double backoff = std::ldexp(settings_.eject_base_s, static_cast<int>(std::min(load.ejections, 30u)));
  const double until = now_s + std::min(backoff, settings_.eject_max_s);
  const Standing before = standing(actor);
  loads_.eject(actor, until);
  changed(actor, before);
  ejected_.push_back(actor);
  next_readmission_s_ = std::min(next_readmission_s_, until);
}

// Re-admits the ejected actors whose time is up (`now_s` NaN: nothing is due).
void Scheduler::end_ejections(double now_s) {
  if (!(now_s >= next_readmission_s_)) return;
  next_readmission_s_ = std::numeric_limits<double>::infinity();
  std::vector<uint32_t> still;
  for (const uint32_t actor : ejected_) {
    const ActorLoad& load = loads_[actor];
    if (!load.ejected) continue;  // re-admitted by a restart
    if (load.ejected_until <= now_s) {
      const Standing before = standing(actor);
      loads_.readmit(actor);
      changed(actor, before);
    } else {
      still.push_back(actor);
      next_readmission_s_ = std::min(next_readmission_s_, load.ejected_until);
    }
  }
  ejected_ = std::move(still);
}

// Checks that `calls` calls (and with `task`, their task) are in flight on `actor`.
void Scheduler::check_held(uint32_t actor, int64_t calls, bool task, const char* what) const {
  const ActorLoad& load = loads_[actor];
  if (calls < 1 || calls > load.own || (task && load.tasks == 0)) {
    throw std::logic_error(std::string(what) + "(actor=" + std::to_string(actor) + ", calls=" +
                           std::to_string(calls) + "): " + std::to_string(load.own) +
                           " calls in " + std::to_string(load.tasks) + " tasks in flight on actor " +
                           std::to_string(actor));
  }
}

Drain Scheduler::complete(int64_t actor, double started_s, double ended_s, int64_t failed,
                          bool drain, int64_t calls, int64_t method, bool timed) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint32_t a = check_actor(actor);
  const uint32_t method_id = check_method(method);
  if (!std::isfinite(started_s) || !std::isfinite(ended_s)) {
    throw std::invalid_argument("complete(actor=" + std::to_string(a) + "): started_s " +
                                format_double(started_s) + ", ended_s " + format_double(ended_s) +
                                ": times must be finite");
  }
  check_held(a, calls, true, "complete");
  if (failed < 0 || failed > calls) {
    throw std::invalid_argument("complete(actor=" + std::to_string(a) + ", calls=" +
                                std::to_string(calls) + "): failed " + std::to_string(failed) +
                                ": must be in [0, calls]");
  }
  see_time(ended_s);
  const Standing before = standing(a);
  loads_.add(a, -static_cast<int32_t>(calls), -1);
  loads_.record(a, started_s, ended_s, static_cast<uint32_t>(failed),
                static_cast<uint32_t>(calls), method_id, timed);
  changed(a, before);
  eject_if_due(a, ended_s);
  end_ejections(ended_s);
  return drain ? drain_locked(a) : Drain{};
}

Drain Scheduler::release(int64_t actor, bool drain, int64_t calls, bool task) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint32_t a = check_actor(actor);
  check_held(a, calls, task, "release");
  add_load(a, -static_cast<int32_t>(calls), task ? -1 : 0);
  return drain ? drain_locked(a) : Drain{};
}

void Scheduler::acquire(int64_t actor) {
  std::lock_guard<std::mutex> lock(mutex_);
  add_load(check_actor(actor), 1, 1);
}

std::optional<uint64_t> Scheduler::cancel(uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = queued_.find(ticket);
  if (it == queued_.end()) return std::nullopt;
  const uint64_t payload = it->second.call->payload;
  const uint32_t group = it->second.group;
  Group& g = groups_[group];
  g.queue.erase(it->second.call);
  if (g.queue.empty()) g.holding = false;
  queued_.erase(it);
  free_if_unused(group);
  return payload;
}

std::vector<Decision> Scheduler::mark_dead(int64_t actor, bool restarting) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint32_t a = check_actor(actor);
  const Status status = loads_[a].status;
  if (status == Status::dead || (restarting && status == Status::restarting)) return {};
  const Standing before = standing(a);
  loads_.set_status(a, restarting ? Status::restarting : Status::dead);
  changed(a, before);
  std::vector<Decision> orphaned;
  if (restarting) return orphaned;
  std::vector<uint32_t> emptied;
  for (const Membership& m : memberships_[a]) {
    Group& g = groups_[m.group];
    if (g.live > 0) continue;
    for (const QueuedCall& call : g.queue) {
      orphaned.push_back({call.ticket, -1, call.payload});
      queued_.erase(call.ticket);
    }
    g.queue.clear();
    g.holding = false;
    if (g.users == 0) emptied.push_back(m.group);  // removed, kept for this queue
  }
  for (const uint32_t group : emptied) free_group(group);  // after the loop over memberships
  std::sort(orphaned.begin(), orphaned.end(),
            [](const Decision& x, const Decision& y) { return x.ticket < y.ticket; });
  return orphaned;
}

Drain Scheduler::mark_alive(int64_t actor) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint32_t a = check_actor(actor);
  if (loads_[a].alive()) return {};
  const Standing before = standing(a);
  loads_.set_status(a, Status::alive);  // a new process: not ejected, no failures counted
  changed(a, before);
  return drain_locked(a);
}

std::vector<Decision> Scheduler::take_queued() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Decision> out;
  for (uint32_t group = 0; group < groups_.size(); ++group) {
    Group& g = groups_[group];
    for (const QueuedCall& call : g.queue) out.push_back({call.ticket, -1, call.payload});
    g.queue.clear();
    g.holding = false;
    free_if_unused(group);
  }
  queued_.clear();
  std::sort(out.begin(), out.end(),
            [](const Decision& x, const Decision& y) { return x.ticket < y.ticket; });
  return out;
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

void Scheduler::share_load(const std::optional<std::string>& path) {
  std::lock_guard<std::mutex> lock(mutex_);
  loads_.share(nullptr);
  shared_.reset();  // a driver holds one row of a table at most
  shared_ = path ? std::make_unique<SharedLoad>(*path, loads_.size())
                 : std::make_unique<SharedLoad>(loads_.size());
  loads_.share(shared_.get());
  learn_others(true);
}

void Scheduler::unshare_load() {
  std::lock_guard<std::mutex> lock(mutex_);
  loads_.share(nullptr);
  shared_.reset();
  for (uint32_t a = 0; a < loads_.size(); ++a) {
    if (loads_[a].others == 0) continue;
    const Standing before = standing(a);
    loads_.set_others(a, 0);
    changed(a, before);
  }
}

void Scheduler::set_remote_load(const std::vector<uint32_t>& calls) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!shared_) throw std::logic_error("set_remote_load: the load of this mesh is not shared");
  shared_->set_remote(calls);
}

uint64_t Scheduler::load_table_id() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return shared_ ? shared_->table_id() : 0;
}

void Scheduler::learn_others(bool force) {
  if (!shared_ || !(force || shared_->due())) return;
  shared_->read(others_);
  for (uint32_t a = 0; a < loads_.size(); ++a) {
    if (others_[a] == loads_[a].others) continue;
    const Standing before = standing(a);
    loads_.set_others(a, others_[a]);
    changed(a, before);
  }
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

uint64_t Scheduler::queued() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return queued_.size();
}

}  // namespace actormesh
