// Liveness and outlier ejection: actors that die, restart or come back, and actors passed over
// for a while after failing calls in a row.
#include "scheduler.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace actormesh {

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
  count_ejection(actor, false);
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
      count_ejection(actor, true);
    } else {
      still.push_back(actor);
      next_readmission_s_ = std::min(next_readmission_s_, load.ejected_until);
    }
  }
  ejected_ = std::move(still);
}

// One more ejection (or readmission) of `actor`, in its count and in the sum the binding checks.
void Scheduler::count_ejection(uint32_t actor, bool readmitted) {
  Ejections& counts = ejections_[actor];
  ++(readmitted ? counts.readmitted : counts.ejected);
  ejection_events_.store(ejection_events_.load(std::memory_order_relaxed) + 1,
                         std::memory_order_relaxed);  // under the mutex: no other writer
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
  const bool was_ejected = loads_[a].ejected;
  loads_.set_status(a, Status::alive);  // a new process: not ejected, no failures counted
  changed(a, before);
  if (was_ejected) count_ejection(a, true);
  return drain_locked(a);
}

}  // namespace actormesh
