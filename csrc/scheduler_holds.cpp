// Stragglers: holding a call back from an actor much slower than the others while they are
// expected to serve it sooner, and where a hedged call's second copy goes.
#include "scheduler.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "policy_adaptive.hpp"

namespace actormesh {

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
// The straggler's time is its estimate slow to rise (`low_s`), or the mean of its latest (up to
// kLatest) samples if that is lower, counted half as much for every kStaleTasksPerActor tasks
// per actor the mesh was sent since the straggler's last: one passed over is tried again now
// and then (sooner when the wait it spares is long), and being stale its next sample replaces
// its estimate, so a straggler that has recovered is seen at once. A judgement that rests on
// fewer than kLatest samples (a new actor's first call, a stale one's) is tried kRetestSooner
// times as often: a first sample sets the estimate outright, and a healthy actor's long call
// (5x the mean or more, once in 150 calls of an exponential) must not pass it over for
// thousands of tasks; the mean of its next calls usually clears it. A true straggler pays 2
// calls more each time it goes stale.
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
  constexpr double kRetestSooner = 25.0;
  if (!may_hold()) return false;
  const ActorLoad& a = loads_[actor];
  if (!a.known()) return false;
  Group& g = groups_[group];
  const auto [others, rate, pace] = others_of(g, actor);
  if (others == 0 || !(rate > 0.0)) return false;
  const double retest_after =
      loads_.stale_after() / (a.latest_count < kLatest ? kRetestSooner : 1.0);
  const double passed_over = static_cast<double>(loads_.age(actor)) / retest_after;
  const double estimate = std::min(a.low_s, a.latest_mean_s(a.low_s));
  const double time = std::max(estimate * std::pow(2.0, -passed_over), kMinTime);
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

}  // namespace actormesh
