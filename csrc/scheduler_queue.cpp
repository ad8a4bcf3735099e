// The queue and the slots: where a call goes when it is submitted (the policy, affinity), where
// it waits when no member has a free slot, and how ends, releases and cancels free slots and
// hand the queued calls on (the drain).
#include "scheduler.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

namespace actormesh {

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

Decision Scheduler::submit(int64_t group, std::optional<uint64_t> affinity, uint64_t payload,
                           double now_s, int64_t method, bool alone) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint32_t id = check_group(group);
  const uint32_t method_id = check_method(method);
  Group& g = groups_[id];
  if (g.live == 0) {
    // A user reads this (am.NoLiveActorsError): no word of the scheduler's own (group, id).
    const size_t n = g.members.size();
    throw NoLiveActors(n == 1 ? std::string("no live actor to run the call: its one actor is dead")
                              : "no live actor to run the call: all " + std::to_string(n) +
                                    " actors it may go to are dead");
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
                          bool drain, int64_t calls, int64_t method, bool timed, double busy_s,
                          const FailureRun& run) {
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
  if (run.known() && (run.first > static_cast<int64_t>(run.longest) ||
                      run.last > run.longest || run.longest > failed)) {
    throw std::invalid_argument("complete(actor=" + std::to_string(a) + ", failed=" +
                                std::to_string(failed) + "): failed_first " +
                                std::to_string(run.first) + ", failed_longest " +
                                std::to_string(run.longest) + ", failed_last " +
                                std::to_string(run.last) +
                                ": runs of failed calls that cannot be");
  }
  see_time(ended_s);
  const Standing before = standing(a);
  loads_.add(a, -static_cast<int32_t>(calls), -1);
  loads_.record(a, started_s, ended_s, static_cast<uint32_t>(failed),
                static_cast<uint32_t>(calls), method_id, timed, busy_s, run);
  changed(a, before);
  eject_if_due(a, ended_s);
  loads_.end_run(a);
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

}  // namespace actormesh
