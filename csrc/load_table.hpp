// Per-actor load of one mesh: the numbers every policy decides on.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "recent_times.hpp"
#include "shared_load.hpp"

namespace actormesh {

// An actor's liveness. A restarting actor takes no call but still counts as live: calls that only
// it can serve wait in the queue for it instead of failing.
enum class Status : uint8_t { alive, restarting, dead };

// How many of an actor's latest samples it keeps (ActorLoad::latest).
constexpr uint32_t kLatest = 3;

// How a task's failed calls fell, in the order its calls ran (`LoadTable::record`): the failed
// calls it began with, its longest run of them, and those it ended with; `first` < 0: unknown.
struct FailureRun {
  int64_t first = -1;
  uint32_t longest = 0;
  uint32_t last = 0;
  bool known() const { return first >= 0; }
};

struct ActorLoad {
  // Calls on the actor not yet completed: this driver's (`own`) and, on a mesh that several
  // drivers share, the other drivers' (`others`, see shared_load.hpp). Policies rank by it;
  // slots bound `own`.
  uint32_t in_flight = 0;
  uint32_t own = 0;        // calls this driver dispatched or acquired and not yet completed
  uint32_t others = 0;
  uint32_t tasks = 0;      // Ray tasks carrying them: a batch of k calls is k in flight, 1 task
  uint64_t last_task = 0;  // when it was last sent a task, counted in tasks sent to the mesh
  Status status = Status::alive;
  bool measured = false;   // ewma_s holds at least one sample
  // The next completion is this incarnation's first: its call may have waited for the actor's
  // __init__, so its sample may include start-up (see LoadTable::record).
  bool fresh = true;
  // It had not been sent a task for a long while (see LoadTable::add): its estimate is stale,
  // and its next sample replaces it.
  bool stale = false;
  double ewma_s = 0.0;     // moving average of service time, seconds
  double low_s = 0.0;      // the same, slow to rise (see `lower`): pipeline rule, speed class
  // Moving average of |sample - ewma_s| / ewma_s: how far a call's service time strays from the
  // estimate (an exponential distribution's is 0.74, a fixed time's near 0); 1 until measured.
  double spread = 1.0;
  // Its latest kLatest samples, a ring (`latest_count` so far, start-up never counts): a
  // straggler's calls are all slow, a heavy tail's only some (Scheduler::holds).
  std::array<double, kLatest> latest{};
  uint32_t latest_count = 0;
  uint32_t latest_next = 0;  // where the next one goes
  double last_end_s = -std::numeric_limits<double>::infinity();  // latest completion seen
  // Outlier ejection: an actor that failed `eject_after` calls in a row is passed over until
  // `ejected_until`, as long as another eligible member can take the call.
  uint32_t failures_in_a_row = 0;
  int64_t run_ends_with = -1;  // set by `record` with a known run, until `end_run`
  uint32_t ejections = 0;  // in a row, without a success in between: the back-off exponent
  bool ejected = false;
  double ejected_until = 0.0;

  bool alive() const { return status == Status::alive; }
  bool live() const { return status != Status::dead; }
  // Measured (start-up never counts): its speed can be trusted.
  bool known() const { return measured; }
  // Its calls take about the same time each (spread below kSteady): what the one it runs has
  // left is predictable.
  bool steady() const;
  // The shortest of its latest kLatest samples; 0 until it has had that many.
  double latest_floor_s() const {
    if (latest_count < kLatest) return 0.0;
    return *std::min_element(latest.begin(), latest.end());
  }
  // The mean of its latest samples (up to kLatest, oldest first); `fallback` with none.
  double latest_mean_s(double fallback) const {
    if (latest_count == 0) return fallback;
    double sum = 0.0;
    for (uint32_t i = 0; i < latest_count; ++i) {
      sum += latest[(latest_next + kLatest - latest_count + i) % kLatest];
    }
    return sum / latest_count;
  }
};

// What the scheduler learns of one method (of every actor): its service time per call, and
// whether its calls may ride a batch.
// A method's estimate learns from its actors' reports only until this many samples came
// without one (see LoadTable::record).
constexpr uint32_t kReportLasts = 64;

struct MethodLoad {
  bool alone = false;  // declared never to be batched
  bool measured = false;
  // Samples since an actor last reported running its calls (LoadTable::record); a report
  // stands while this is below kReportLasts, and none has yet at the start.
  uint32_t unreported = kReportLasts;
  double ewma_s = 0.0;  // service time per call, seconds, slow to rise (see `lower`)
  RecentTimes recent;   // the latest samples, for a percentile (the hedge delay)
};

// A moving average that falls as an EWMA does and rises `kRiseSlower` times slower. A sample
// measured on the driver includes the driver's own delays (a completion callback waiting for
// the GIL while the caller sends a burst can add milliseconds): they inflate samples, never
// deflate them. The estimates that size batches and allow a second task must not collapse on
// them, or a burst of tiny calls would stop riding together exactly when it should; a method
// that is really slow still shows as slow within a few calls.
constexpr double kRiseSlower = 8.0;
inline double lower(double estimate, double sample, double weight) {
  return estimate + (sample < estimate ? weight : weight / kRiseSlower) * (sample - estimate);
}

// An actor not sent a task while the mesh was sent this many per actor is stale (its estimate
// may be out of date); a held-back straggler's estimate counts half as much after as long.
constexpr double kStaleTasksPerActor = 200.0;

// A failed call is a sample of this many times the actor's estimate (see LoadTable::record).
constexpr double kFailurePenalty = 2.0;
// The longest service time the core reasons with: an estimate that failures keep raising stops
// there (an hour), and stays finite.
constexpr double kMaxTime = 3600.0;

// A spread below this is a steady actor's (see ActorLoad::steady).
constexpr double kSteady = 0.25;

// The shortest service time the core reasons with: a sample of 0 s (a completion reported at the
// instant of its send) must not make an actor infinitely fast.
constexpr double kMinTime = 1e-9;

inline bool ActorLoad::steady() const { return known() && spread < kSteady; }

// How many Ray tasks an actor may hold at once: the pipeline depth.
struct TaskLimits {
  uint32_t max_tasks = 0;   // per actor; 0 = unbounded
  double pipeline_s = 0.0;  // a task beyond the first only while the actor's EWMA is below it
};

// The load table of one scheduler, shared by all of its groups.
class LoadTable {
 public:
  LoadTable(uint32_t num_actors, uint32_t max_in_flight, TaskLimits tasks, double ewma_alpha,
            double prior_s)
      : actors_(num_actors), methods_(1), max_in_flight_(max_in_flight), tasks_(tasks),
        alpha_(ewma_alpha), prior_s_(prior_s) {}

  uint32_t size() const { return static_cast<uint32_t>(actors_.size()); }
  uint32_t max_in_flight() const { return max_in_flight_; }
  uint32_t max_tasks() const { return tasks_.max_tasks; }
  const ActorLoad& operator[](uint32_t actor) const { return actors_[actor]; }

  // Alive with a free call slot (max_in_flight 0 means unbounded) and a free task slot: it may
  // take a call now. A task beyond the first waits in the actor behind the running one, which
  // hides the round trip between two tasks but commits the call to a busy actor: so it is
  // allowed only while the actor's calls are measured short (below `pipeline_s`), or steady (the
  // wait behind the running one is then about what the call would wait for any actor to free).
  bool eligible(uint32_t actor) const {
    const ActorLoad& a = actors_[actor];
    return a.alive() && has_call_slot(actor) && has_task_slot(a);
  }

  bool has_call_slot(uint32_t actor) const {
    return max_in_flight_ == 0 || actors_[actor].own < max_in_flight_;
  }

  // Eligible and not ejected: what the policies choose among while there is any.
  bool preferred(uint32_t actor) const { return eligible(actor) && !actors_[actor].ejected; }

  // Back to a fresh state of liveness: a restarted actor is a new process.
  void set_status(uint32_t actor, Status status) {
    ActorLoad& a = actors_[actor];
    a.status = status;
    if (status == Status::alive) {
      forget(actor);
      a.fresh = true;  // a new process: its first call may wait for its __init__
      a.failures_in_a_row = 0;
      a.ejections = 0;
      a.ejected = false;
    }
  }

  // Passed over until `until_s`; one more ejection counts towards the next, longer one.
  void eject(uint32_t actor, double until_s) {
    ActorLoad& a = actors_[actor];
    a.ejected = true;
    a.ejected_until = until_s;
    ++a.ejections;
    a.failures_in_a_row = 0;
  }

  // After a task whose failures' order was known (`record`'s `run`) and the ejection its
  // longest run may have decided: the run the actor is left with is the task's last failures.
  void end_run(uint32_t actor) {
    ActorLoad& a = actors_[actor];
    if (a.run_ends_with >= 0) {  // an ejection just decided has counted the run from 0
      a.failures_in_a_row =
          std::min(a.failures_in_a_row, static_cast<uint32_t>(a.run_ends_with));
      a.run_ends_with = -1;
      if (!a.ejected) a.ejections = 0;  // a success, after the ejection its run may have made
    }
  }

  // Its ejection is over (the count of ejections stays until a success resets it), and its
  // speed is to be measured again.
  void readmit(uint32_t actor) {
    actors_[actor].ejected = false;
    forget(actor);
  }
  // `calls` more (or fewer) calls in flight, carried by `tasks` more (or fewer) Ray tasks.
  void add(uint32_t actor, int32_t calls, int32_t tasks) {
    ActorLoad& a = actors_[actor];
    a.own += calls;
    a.in_flight += calls;
    a.tasks += tasks;
    if (tasks > 0) {
      if (static_cast<double>(age(actor)) >= stale_after()) a.stale = true;
      a.last_task = ++tasks_sent_;
    }
    if (shared_ != nullptr) shared_->publish(actor, a.own);
  }

  // Other drivers have `calls` calls in flight on `actor`.
  void set_others(uint32_t actor, uint32_t calls) {
    ActorLoad& a = actors_[actor];
    a.others = calls;
    a.in_flight = a.own + calls;
  }

  // Publishes this driver's counts to `shared` from now on (null: to nobody).
  void share(SharedLoad* shared) {
    shared_ = shared;
    if (shared_ == nullptr) return;
    for (uint32_t actor = 0; actor < size(); ++actor) shared_->publish(actor, actors_[actor].own);
  }

  // Tasks sent to the mesh since `actor` was last sent one.
  uint64_t age(uint32_t actor) const { return tasks_sent_ - actors_[actor].last_task; }
  double stale_after() const { return kStaleTasksPerActor * static_cast<double>(size()); }

  // Registers a method; its id indexes `method`. Method 0 exists from the start: any call.
  uint32_t add_method(bool alone) {
    MethodLoad method;
    method.alone = alone;
    methods_.push_back(std::move(method));
    return static_cast<uint32_t>(methods_.size() - 1);
  }
  uint32_t num_methods() const { return static_cast<uint32_t>(methods_.size()); }
  const MethodLoad& method(uint32_t id) const { return methods_[id]; }

  // Records that a task of `calls` calls, `failed` of which failed (raised, or were lost), ran
  // from started_s to ended_s (a lone call is a task of one). The time per call starts at the
  // later of its start and the actor's previous completion: when the actor was backlogged the
  // task waited behind others, and only the completion-to-completion interval is work. Each call
  // is one sample of an equal share of it, so the EWMA moves as far as `calls` samples move it,
  // in O(1). Shares that come out negative (completions reported out of order) carry no
  // information and are dropped.
  //
  // Failures count per call, never per task: a task with one failed call in ten is nine
  // successes and one failure. `run`, when known, is how its calls failed in the order they
  // ran, and the actor's run of failures moves as if they had been sent one by one: the task's
  // first failures continue the run, its longest run is reached, and it ends with its last
  // ones (`end_run` then sets them, once an ejection was decided on the longest). When the order
  // is not known, a task whose calls mostly succeeded ends the run (a task of 64 calls with 6
  // raising is a healthy actor, not 6 failures in a row) and one whose calls mostly failed
  // starts one. A failed call is no service-time sample of its method, but it is one for the
  // actor: a penalty, twice the larger of its share and the actor's
  // estimate (the method's while the actor is unmeasured), so that an actor that fails fast
  // never looks fast: each failed call in a row multiplies its estimate by about 1 + alpha.
  // Without `timed` the end time is not known well enough to measure anything: only the
  // outcome counts.
  //
  // `busy_s`, when finite, is how long the actor itself spent running the task's calls, on its
  // own clock (NaN: not reported; a task of one call goes as the method's own Ray call, which
  // reports nothing). The method's estimate is what a call costs the actor, for sizing batches:
  // the first report replaces it, and from then on the method learns from reports only (an
  // unmeasured method's batches stay small, so reports come). A share measured on the
  // driver carries the round trip (a lone call's, ~1-2 ms) and the spacing at which a busy
  // driver happens to see completions; mixed in, it swung one no-op method's estimate between 3
  // µs and 1 ms from one burst to the next, and with it the batches' sizes. A report moves the
  // estimate as one sample, not `calls`: what disturbs it (the actor's process descheduled
  // mid-task on a loaded machine, a collection of its garbage) is one event shared by its calls.
  // The actor's own estimate, and the method's window of recent times, keep the share: they are
  // about what the driver waits. A report lasts kReportLasts samples: a method whose calls then
  // went alone for that long learns from shares again (rising slowly, as before any report),
  // so that calls grown slower meanwhile are not sized, nor sent unstreamed, by an old report;
  // its next report replaces the estimate again.
  //
  // Start-up: the first completion of an incarnation (`fresh`) may have waited for the actor's
  // __init__ (a call sent to an actor that is still starting). Such a sample may lower an
  // estimate but never raise one, and never makes one: an actor (or method) whose only sample
  // is a start-up stays unmeasured, and its next sample is its first. So start-up never enters
  // an estimate, and no estimate rests on one lucky sample (the first moves the prior). Start-up
  // samples never enter the percentile window. A stale estimate (see `add`) is replaced by the
  // next sample: a straggler that was passed over for long may have recovered.
  void record(uint32_t actor, double started_s, double ended_s, uint32_t failed,
              uint32_t calls = 1, uint32_t method = 0, bool timed = true,
              double busy_s = std::numeric_limits<double>::quiet_NaN(),
              const FailureRun& run = FailureRun{}) {
    ActorLoad& a = actors_[actor];
    const uint32_t succeeded = calls - failed;
    if (run.known() && succeeded > 0) {
      a.failures_in_a_row = std::max(a.failures_in_a_row + static_cast<uint32_t>(run.first),
                                     run.longest);
      a.run_ends_with = run.last;  // and the ejections reset by its success: `end_run`
    } else if (run.known() || succeeded < failed) {
      a.failures_in_a_row = failed + (succeeded == 0 ? a.failures_in_a_row : 0);
    } else {
      a.failures_in_a_row = 0;
      if (!a.ejected) a.ejections = 0;
    }
    if (!timed) return;
    const double share = (ended_s - std::max(started_s, a.last_end_s)) / calls;
    a.last_end_s = std::max(a.last_end_s, ended_s);
    if (share < 0.0) return;
    const bool startup = a.fresh;
    const bool stale = a.stale && !startup;
    a.fresh = false;
    if (!startup) a.stale = false;
    if (succeeded > 0) {
      const double weight = succeeded == 1 ? alpha_ : 1.0 - std::pow(1.0 - alpha_, succeeded);
      learn_actor(a, share, weight, startup, stale);
      const bool reported = std::isfinite(busy_s);
      learn_method(methods_[method], share, reported ? std::max(busy_s, 0.0) / calls : share,
                   reported ? alpha_ : weight, reported, startup);
      if (!startup) remember_latest(a, share);
    }
    for (uint32_t call = 0; call < failed; ++call) learn_failure(a, share, methods_[method]);
  }

  // An actor seen anew (a restart, the end of an ejection): what was learnt of it is forgotten,
  // so that it is measured again (`adaptive` tries an actor of unknown speed first).
  void forget(uint32_t actor) {
    ActorLoad& a = actors_[actor];
    if (a.measured) {
      ewma_sum_ -= a.ewma_s;
      --measured_;
    }
    a.measured = false;
    a.stale = false;
    a.ewma_s = 0.0;
    a.low_s = 0.0;
    a.spread = 1.0;
    a.latest_count = 0;
    a.latest_next = 0;
    if (measured_ == 0) ewma_sum_ = 0.0;  // exact again, as the reference keeps it
  }

  // Mean EWMA over measured actors, or `fallback` when none is measured. The sum is kept
  // incrementally (the reference does the same operations in the same order, so both round alike).
  double mean_ewma_or(double fallback) const {
    return measured_ == 0 ? fallback : ewma_sum_ / measured_;
  }

 private:
  // `record`'s sample for the actor's estimate.
  void learn_actor(ActorLoad& a, double sample, double weight, bool startup, bool stale) {
    if (!a.measured) {
      if (startup) return;  // no estimate from start-up alone
      // The first sample moves the prior like any other: one lucky (or unlucky) call must not
      // make an actor look many times faster than the rest, or `sed` queues calls behind it.
      const double prior = prior_s_ > 0.0 ? prior_s_ : mean_ewma_or(sample);
      a.measured = true;
      a.ewma_s = prior + weight * (sample - prior);
      a.low_s = sample;
      ewma_sum_ += a.ewma_s;
      ++measured_;
    } else if (stale) {  // the estimate is out of date: start from this sample
      ewma_sum_ += sample - a.ewma_s;
      a.ewma_s = sample;
      a.low_s = sample;
      a.latest_count = 0;
    } else if (!startup || sample < a.ewma_s) {
      const double old = a.ewma_s;
      if (!startup) a.spread += weight * (std::abs(sample - old) / std::max(old, kMinTime) - a.spread);
      a.ewma_s = old + weight * (sample - old);
      const double low = lower(a.low_s, sample, weight);
      a.low_s = startup ? std::min(a.low_s, low) : low;
      ewma_sum_ += a.ewma_s - old;
    }
  }

  // `record`'s samples for the method's window of recent times (`share`) and for its estimate
  // (`sample`, an actor's report if `reported`).
  static void learn_method(MethodLoad& m, double share, double sample, double weight,
                           bool reported, bool startup) {
    if (!startup) m.recent.add(share);
    if (reported) {
      if (m.unreported >= kReportLasts) m.measured = false;  // what the shares taught: dropped
      m.unreported = 0;
    } else if (m.unreported < kReportLasts && ++m.unreported < kReportLasts) {
      return;  // a report stands: shares do not move the estimate
    }
    if (startup) {
      if (m.measured && sample < m.ewma_s) m.ewma_s = lower(m.ewma_s, sample, weight);
      return;
    }
    m.ewma_s = m.measured ? lower(m.ewma_s, sample, weight) : sample;
    m.measured = true;
  }

  // `record`'s penalty for one failed call (see there); capped at kMaxTime.
  void learn_failure(ActorLoad& a, double share, const MethodLoad& m) {
    const double reference = a.measured ? a.ewma_s : m.measured ? m.ewma_s : share;
    const double sample = std::min(kFailurePenalty * std::max(share, reference), kMaxTime);
    if (!a.measured) {
      a.measured = true;
      a.ewma_s = sample;
      a.low_s = sample;
      ewma_sum_ += sample;
      ++measured_;
    } else {
      const double old = a.ewma_s;
      a.spread += alpha_ * (std::abs(sample - old) / std::max(old, kMinTime) - a.spread);
      a.ewma_s = old + alpha_ * (sample - old);
      a.low_s += alpha_ * (sample - a.low_s);  // a failure is no driver delay: full weight
      ewma_sum_ += a.ewma_s - old;
    }
    remember_latest(a, sample);
  }

  static void remember_latest(ActorLoad& a, double sample) {
    a.latest[a.latest_next] = sample;
    a.latest_next = (a.latest_next + 1) % kLatest;
    a.latest_count = std::min(a.latest_count + 1, kLatest);
  }

  bool has_task_slot(const ActorLoad& a) const {
    if (tasks_.max_tasks == 0 || a.tasks == 0) return true;
    return a.tasks < tasks_.max_tasks &&
           (tasks_.pipeline_s <= 0.0 || (a.measured && a.low_s < tasks_.pipeline_s) ||
            a.steady());
  }

  std::vector<ActorLoad> actors_;
  std::vector<MethodLoad> methods_;
  uint32_t max_in_flight_;
  TaskLimits tasks_;
  double alpha_;
  double prior_s_;  // the estimate a first sample moves from; 0: the mean of measured actors
  double ewma_sum_ = 0.0;
  uint32_t measured_ = 0;
  uint64_t tasks_sent_ = 0;
  SharedLoad* shared_ = nullptr;  // owned by the scheduler
};

}  // namespace actormesh
