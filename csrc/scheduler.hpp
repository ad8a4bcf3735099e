// The scheduler of one mesh: its load table, its groups, their queues and the balancing policy.
#pragma once

#include <cstdint>
#include <exception>
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

namespace actormesh {

struct SchedulerConfig {
  int64_t num_actors = 1;
  std::string policy = "pow2";
  int64_t max_in_flight = 0;  // per actor; 0 = unbounded (pull: 0 means 1)
  uint64_t seed = 0;
  double ewma_alpha = 0.2;
  double prior_s = 0.0;
  int64_t affinity_abs = 2;
  double affinity_rel = 1.5;
  int64_t affinity_capacity = 65536;
  Picker picker;  // when set, the policy is `external`
};

struct Decision {
  uint64_t ticket;
  int32_t actor;  // -1: queued
};

// What complete() and mark_alive() hand back.
struct Drain {
  std::vector<Decision> dispatched;  // queued calls now running, already counted in flight
  // Queued calls whose pick threw (only an external picker can). They are out of their queue and
  // must be failed by the caller with `error`, the first exception thrown.
  std::vector<uint64_t> failed;
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
  explicit Scheduler(SchedulerConfig config);

  uint32_t add_group(const std::vector<int64_t>& members);
  std::vector<uint32_t> group_members(int64_t group) const;

  Decision submit(int64_t group, std::optional<uint64_t> affinity);
  Drain complete(int64_t actor, double started_s, double ended_s, bool ok);
  void acquire(int64_t actor);
  bool cancel(uint64_t ticket);
  std::vector<uint64_t> mark_dead(int64_t actor);
  Drain mark_alive(int64_t actor);

  std::vector<uint32_t> in_flight() const;
  std::vector<double> mean_latency_s() const;
  std::vector<bool> alive() const;
  uint64_t queued() const;

  uint32_t num_actors() const { return loads_.size(); }
  const std::string& policy() const { return config_.policy; }
  uint32_t max_in_flight() const { return loads_.max_in_flight(); }
  bool uses_picker() const { return settings_.kind == PolicyKind::external; }

 private:
  // Where a queued ticket waits, for cancel().
  struct QueuePlace {
    uint32_t group;
    std::list<QueuedCall>::iterator call;
  };

  uint32_t check_actor(int64_t actor) const;
  uint32_t check_group(int64_t group) const;
  bool is_member(uint32_t group, uint32_t actor) const;

  // Propagates a change of `actor`'s load or liveness to every group it belongs to; the
  // arguments describe the actor before the change.
  void changed(uint32_t actor, uint32_t old_in_flight, bool was_eligible, bool was_alive);
  void dispatch(uint32_t actor);
  uint32_t choose(uint32_t group, std::optional<uint64_t> affinity);
  bool sticks(uint32_t group, uint32_t actor) const;
  Drain drain(uint32_t actor);

  mutable std::mutex mutex_;
  const SchedulerConfig config_;  // validated; first, since the members below are built from it
  const PolicySettings settings_;
  LoadTable loads_;
  SplitMix64 rng_;
  AffinityTable affinity_;
  std::vector<Group> groups_;
  std::map<std::vector<uint32_t>, uint32_t> group_ids_;  // members -> group, for deduplication
  std::vector<std::vector<Membership>> memberships_;     // per actor
  std::unordered_map<uint64_t, QueuePlace> queued_;      // ticket -> its place in a queue
  uint64_t next_ticket_ = 1;
};

}  // namespace actormesh
