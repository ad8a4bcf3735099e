// The scheduler of one mesh: its load table, its groups, their queues and the balancing policy.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "affinity.hpp"
#include "group.hpp"
#include "load_table.hpp"
#include "picker.hpp"
#include "policy.hpp"
#include "rng.hpp"
#include "settings.hpp"
#include "shared_load.hpp"

namespace actormesh {

struct Decision {
  uint64_t ticket;
  int32_t actor;     // -1: queued (from submit) or never to run (from mark_dead, take_queued)
  uint64_t payload;  // what the caller gave submit; 0 for a call dispatched at once
  // In a drain: the calls of one Ray task are consecutive decisions; the first says how many
  // (1: a lone call), the others say 0.
  uint32_t calls = 1;
};

// What complete(), drain() and mark_alive() hand back.
struct Drain {
  std::vector<Decision> dispatched;  // queued calls now running, already counted in flight
  // Queued calls whose pick threw (only an external picker can). They are out of their queue and
  // must be failed by the caller with `error`, the first exception thrown.
  std::vector<Decision> failed;
  std::exception_ptr error;
};

// submit() on a group whose members are all dead.
class NoLiveActors : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Every public method takes the scheduler's mutex, so any thread may call any method.
class Scheduler {
 public:
  // Throws std::invalid_argument naming a bad setting (see validated()).
  Scheduler(int64_t num_actors, Settings settings);

  // Registers a group (the same members again: the same id, one more user).
  uint32_t add_group(const std::vector<int64_t>& members);
  // One user fewer; the last one frees the group (once its queue is empty) and its id for reuse.
  void remove_group(int64_t group);
  std::vector<uint32_t> group_members(int64_t group) const;
  uint32_t num_groups() const;

  // Registers a method whose calls are expected to take alike; `alone`: they never ride a batch.
  uint32_t add_method(bool alone);
  // A method's service time per call (moving average), NaN until measured.
  double method_latency_s(int64_t method) const;
  // The q-quantile (0 < q <= 1) of a method's latest service times per call (start-up left
  // out), NaN until enough are known: what a hedged call waits for before its second copy.
  double method_quantile_s(int64_t method, double q) const;
  // How many calls of `method` a freed slot would take as one task now (1 when they never
  // ride a batch): what fits the budget of expected service time, at most `coalesce` (with no
  // backlog: see Scheduler::budget).
  uint32_t batch_size(int64_t method) const;

  // Picks an actor for a call of `method`, or queues the call with its payload (`alone`: it
  // never rides a batch). `now_s` (the clock of complete's times; NaN: unknown) ends the
  // ejections that are due and times holds.
  Decision submit(int64_t group, std::optional<uint64_t> affinity, uint64_t payload = 0,
                  double now_s = std::numeric_limits<double>::quiet_NaN(), int64_t method = 0,
                  bool alone = false);
  // A second copy of a call running on `first` (hedging): the preferred member of the group that
  // the adaptive order puts first (with `idle`, one with no call in flight), other than `first`
  // and not over twice as slow as it, counted as a call and a task; -1 when there is none, or
  // when calls wait in the group's queue (they come first).
  int32_t hedge(int64_t group, int64_t first, bool idle = true);
  // When the earliest hold ends (the scheduler's clock), +inf when no call is held back.
  double hold_deadline_s() const;
  // Ends the holds that are due at `now_s`: their calls go to the actors they were held from.
  Drain expire_holds(double now_s);
  // Whether this scheduler may hold calls back (hold_ratio > 0, adaptive, task slots).
  bool may_hold() const;
  // Ends one Ray task of `calls` calls, `failed` of which failed (of `method` for its
  // service-time sample; none without `timed`, when the end time is not known; `busy_s`: the
  // seconds the actor reported running them, NaN if it did not). With `drain` false the queued
  // calls its slots could take are left for drain().
  // `run`: how the failed calls fell in the order the calls ran, when known (LoadTable::record).
  Drain complete(int64_t actor, double started_s, double ended_s, int64_t failed,
                 bool drain = true, int64_t calls = 1, int64_t method = 0, bool timed = true,
                 double busy_s = std::numeric_limits<double>::quiet_NaN(),
                 const FailureRun& run = FailureRun{});
  Drain drain(int64_t actor);
  // Gives back `calls` call slots that no call used (queued calls given a slot after they were
  // cancelled), and with `task` the task slot they were to share.
  Drain release(int64_t actor, bool drain = true, int64_t calls = 1, bool task = true);
  // Counts a call sent without asking (all, shard): a call and a task, whatever the limits.
  void acquire(int64_t actor);
  // Takes a queued call out of its queue: its payload, or nothing if it is not queued.
  std::optional<uint64_t> cancel(uint64_t ticket);
  // `restarting`: the actor takes no call but stays live, so calls only it can serve wait for it.
  // Returns the queued calls that can never run: their group has no live member left.
  std::vector<Decision> mark_dead(int64_t actor, bool restarting = false);
  Drain mark_alive(int64_t actor);
  // Takes every queued call out of its queue (the mesh shuts down).
  std::vector<Decision> take_queued();

  // Several drivers: from now on this driver's calls are published to the shared-memory table at
  // `path` (created by the first driver; nullopt: no table, remote counts only) and the other
  // drivers' calls count in every actor's load (see shared_load.hpp). Throws std::runtime_error
  // when the table cannot be used.
  void share_load(const std::optional<std::string>& path);
  // Stops publishing and forgets the other drivers' calls.
  void unshare_load();
  // Calls that drivers on other hosts have in flight, per actor (the mesh must be shared).
  void set_remote_load(const std::vector<uint32_t>& calls);
  // The id of the table this driver shares (the same for every driver of its host); 0 unshared.
  uint64_t load_table_id() const;

  // Calls `visit(payload)` for every queued call. Returns false, visiting nothing, when another
  // thread holds the scheduler (a garbage collector must not wait for it).
  template <typename Visit>
  bool try_visit_payloads(Visit&& visit) const {
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    for (const Group& g : groups_) {
      for (const QueuedCall& call : g.queue) visit(call.payload);
    }
    return true;
  }

  // Every actor's load at one instant (one lock).
  struct ActorState {
    uint32_t in_flight;  // this driver's calls
    uint32_t tasks;
    double mean_latency_s;  // NaN until measured
    Status status;
    bool ejected;
    uint32_t others;  // other drivers' calls, as last learnt (fresh for a snapshot)
  };
  std::vector<ActorState> snapshot();

  std::vector<uint32_t> in_flight() const;  // this driver's calls per actor
  std::vector<uint32_t> tasks() const;
  std::vector<double> mean_latency_s() const;
  std::vector<bool> alive() const;
  std::vector<Status> status() const;
  std::vector<bool> ejected() const;
  // How often each actor was ejected, and readmitted (its time was up, or it restarted), since
  // the scheduler began: counts that only grow, so a reader that reads them now and then misses
  // no ejection, however short.
  struct Ejections {
    uint64_t ejected;
    uint64_t readmitted;
  };
  std::vector<Ejections> ejections() const;
  // Every actor's ejections and readmissions together; read without the lock, so that the
  // binding can tell after each submit or complete, for the price of a load, whether one of
  // them ejected or readmitted an actor.
  uint64_t ejection_events() const { return ejection_events_.load(std::memory_order_relaxed); }
  uint64_t queued() const;

  uint32_t num_actors() const { return loads_.size(); }
  const std::string& policy() const { return settings_.policy; }
  uint32_t max_in_flight() const { return loads_.max_in_flight(); }
  uint32_t max_tasks() const { return loads_.max_tasks(); }
  int64_t eject_after() const { return settings_.eject_after; }
  uint32_t coalesce() const { return static_cast<uint32_t>(settings_.coalesce); }
  uint64_t affinity_capacity() const { return static_cast<uint64_t>(settings_.affinity_capacity); }
  bool uses_picker() const { return policy_.kind == PolicyKind::external; }

 private:
  // Where a queued ticket waits, for cancel().
  struct QueuePlace {
    uint32_t group;
    std::list<QueuedCall>::iterator call;
  };

  // The core (scheduler.cpp): checks, and what the groups of an actor know of it.
  uint32_t check_actor(int64_t actor) const;
  uint32_t check_group(int64_t group) const;
  uint32_t check_method(int64_t method) const;
  bool is_member(uint32_t group, uint32_t actor) const;
  // What the groups of an actor know of it; taken before a change and compared after it.
  struct Standing {
    uint32_t in_flight;
    bool live;
    bool eligible;
    bool preferred;
    bool healthy;  // alive and not ejected
    bool rated;    // alive, not ejected, and its speed known
    double rate;   // its speed, 1 / low_s, when rated; else 0
    double pace;   // 1 / ewma_s (its mean time, not the estimate slow to rise), when rated
  };
  Standing standing(uint32_t actor) const;
  // The group's rated members other than `actor`: how many, their summed speeds (`rate`) and
  // summed mean speeds (`pace`).
  struct Others {
    uint32_t count;
    double rate;
    double pace;
  };
  Others others_of(const Group& group, uint32_t actor) const;
  // Propagates a change of `actor`'s load, liveness or ejection to every group it belongs to.
  void changed(uint32_t actor, const Standing& before);
  // Counts `calls` more calls on `actor`, carried by `tasks` more tasks.
  void add_load(uint32_t actor, int32_t calls, int32_t tasks);
  void see_time(double now_s);

  // Groups (scheduler_groups.cpp).
  void free_group(uint32_t group);
  void free_if_unused(uint32_t group);

  // The queue and the slots (scheduler_queue.cpp).
  std::optional<uint32_t> choose(uint32_t group, const QueuedCall& call, uint64_t waiting);
  bool sticks(uint32_t group, uint32_t actor) const;
  uint32_t least_loaded_eligible(const Group& group) const;
  // Of `actor`'s groups with a queue that `accept` lets through, the one whose first call is
  // the oldest (defined below: the drain and the batches both use it).
  template <class Accept>
  std::optional<uint32_t> oldest_queue(uint32_t actor, Accept accept) const;
  Drain drain_locked(uint32_t actor);
  void dispatch_queued(uint32_t group, uint32_t actor, const QueuedCall& call, Drain& out);
  void check_held(uint32_t actor, int64_t calls, bool task, const char* what) const;

  // Coalescing and batch sizing (scheduler_batches.cpp).
  double expected_s(const QueuedCall& call) const;
  bool may_ride(const QueuedCall& call) const;
  bool not_slower(const Group& group, uint32_t actor) const;
  struct Budget {
    double seconds;  // the calls' expected service times add up to at most this
    uint32_t calls;  // but a task takes this many calls, if it can, whatever their times
  };
  Budget budget(uint32_t group, uint32_t actor) const;
  void add_mates(uint32_t group, uint32_t actor, const QueuedCall& first, Drain& out);
  void pipeline_backlog(uint32_t actor, Drain& out);

  // Stragglers: holds and hedges (scheduler_holds.cpp).
  bool holds(uint32_t group, uint32_t actor, uint64_t waiting);
  void dispatched_from(uint32_t group);
  std::optional<uint32_t> free_member(uint32_t group, int64_t exclude, bool idle) const;

  // Liveness and ejection (scheduler_failures.cpp).
  void eject_if_due(uint32_t actor, double now_s);
  void end_ejections(double now_s);
  void count_ejection(uint32_t actor, bool readmitted);

  // Several drivers (scheduler_drivers.cpp): counts the other drivers' calls as the shared
  // table says now, if a refresh is due.
  void learn_others(bool force = false);

  mutable std::mutex mutex_;
  const Settings settings_;  // validated; first, since the members below are built from it
  const PolicySettings policy_;
  LoadTable loads_;
  SplitMix64 rng_;
  AffinityTable affinity_;
  std::vector<Group> groups_;
  std::map<std::vector<uint32_t>, uint32_t> group_ids_;  // members -> group, for deduplication
  std::vector<uint32_t> free_ids_;                       // freed groups, for reuse
  std::vector<std::vector<Membership>> memberships_;     // per actor
  std::unordered_map<uint64_t, QueuePlace> queued_;      // ticket -> its place in a queue
  uint64_t next_ticket_ = 1;
  std::vector<uint32_t> ejected_;  // actors ejected, some perhaps re-admitted since
  std::vector<Ejections> ejections_;           // per actor, see ejections()
  std::atomic<uint64_t> ejection_events_{0};  // their sum, see ejection_events()
  double next_readmission_s_ = std::numeric_limits<double>::infinity();
  double clock_ = 0.0;  // the latest time seen (submit, complete, expire_holds)
  // No hold ends before this; may be early (a hold that ended since), never late.
  double earliest_hold_ = std::numeric_limits<double>::infinity();
  std::unique_ptr<SharedLoad> shared_;  // null unless several drivers share the mesh
  std::vector<uint32_t> others_;        // scratch for learn_others
};

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

}  // namespace actormesh
