// Coalescing and batch sizing: which queued calls ride one Ray task, how many fit its budget of
// expected service time, and the second task an actor takes under a backlog.
#include "scheduler.hpp"

#include <algorithm>
#include <cmath>
#include <optional>

namespace actormesh {

uint32_t Scheduler::batch_size(int64_t method) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const QueuedCall call{0, std::nullopt, 0, check_method(method), false};
  if (settings_.coalesce == 1 || !may_ride(call)) return 1;
  const double fits = std::floor(settings_.batch_budget_s / expected_s(call));
  return static_cast<uint32_t>(std::clamp(fits, 1.0, static_cast<double>(settings_.coalesce)));
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

// The expected duration a task opened from `group`'s queue on `actor` (of known speed: see
// add_mates) may carry, and the calls it takes even beyond it. Normally batch_budget_s, and no
// minimum. Under a backlog of `group`
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
  if (depth < 1.0 || a.failures_in_a_row > 0 || !not_slower(g, actor)) {
    return {settings_.batch_budget_s, 1};
  }
  return {settings_.batch_budget_s * std::min(depth, kBacklogBudgets), 2};
}

// Coalescing: after `first` was dispatched from `group` to `actor` (the last decision in `out`),
// the calls that wait for `actor` (in any of its groups, oldest first) join its task while each
// may ride, the task holds fewer than `coalesce` calls, the actor has a free call slot, and the
// expected service times add up to the budget (or the task holds fewer calls than the budget's
// minimum). They stop at the first call that may not ride, so every queue still leaves in FIFO
// order. Ties between groups go to the oldest ticket, as in a drain. An actor of unknown speed
// (new, restarted, back from an ejection: measured beyond start-up by no call yet) takes its
// calls one per task, as a pool does: it may be a straggler, and a batch sized by the method's
// estimate (or, unmeasured, by a quarter of the budget each) would all wait behind it.
void Scheduler::add_mates(uint32_t group, uint32_t actor, const QueuedCall& first, Drain& out) {
  if (settings_.coalesce == 1 || !may_ride(first) || !loads_[actor].known()) return;
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

// Under a backlog, `actor`, which has just freed a task slot and taken the next call, takes a
// second one, to wait behind the first in the actor. Between two tasks a Ray actor idles for a
// round trip (its end reaches the driver, the next call travels back): ~1.3 ms against calls of
// 10 ms on the machines measured, so at 90% load the actors are in fact busy ~95% of the time
// and a backlog drains slowly. A call sent ahead starts the instant the one before it ends.
// What it costs: the call waits for that actor's call to end rather than for the first of any.
// So only under a backlog of twice the group's live members, where every call waits through
// several ends anyway and the round trips saved are what makes the queue drain sooner; and
// only behind calls that take about the same time each: the call sent ahead waits for the end
// of that actor's call, where a call left in the queue waits for the first end of any, which
// for times as variable as exponential ones (their residual is their mean) costs the tail more
// than the round trip saves (measured, make bench at 6103ece: p99 in bursts of 10 ms
// exponential calls 0.938x ActorPool's, pull 0.988x). The queued method's recent times must
// have a 90th percentile within kTail times their median (times within +-50% of their mean:
// at most 1.5; a gamma of coefficient of variation 0.5: 1.8; exponential: 3.3, ~3 with the
// round trip in the samples; lognormal with sigma 2: 13; too few samples: no); nor behind a
// straggler: the actor must be measured no slower than kSlower times
// the others' harmonic mean. A call with an affinity key goes by its key, and an external
// picker sees every call: those wait as before, and the calls behind them too.
void Scheduler::pipeline_backlog(uint32_t actor, Drain& out) {
  constexpr double kTail = 2.0;
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

}  // namespace actormesh
