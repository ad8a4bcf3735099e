// Per-actor load of one mesh: the numbers every policy decides on.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace actormesh {

struct ActorLoad {
  uint32_t in_flight = 0;  // calls dispatched or acquired and not yet completed
  bool alive = true;
  bool measured = false;   // ewma_s holds at least one sample
  double ewma_s = 0.0;     // moving average of service time, seconds
  double last_end_s = -std::numeric_limits<double>::infinity();  // latest completion seen
};

// The load table of one scheduler, shared by all of its groups.
class LoadTable {
 public:
  LoadTable(uint32_t num_actors, uint32_t max_in_flight, double ewma_alpha, double prior_s)
      : actors_(num_actors), max_in_flight_(max_in_flight), alpha_(ewma_alpha),
        prior_s_(prior_s) {}

  uint32_t size() const { return static_cast<uint32_t>(actors_.size()); }
  uint32_t max_in_flight() const { return max_in_flight_; }
  const ActorLoad& operator[](uint32_t actor) const { return actors_[actor]; }

  // Alive with a free slot (max_in_flight 0 means unbounded).
  bool eligible(uint32_t actor) const {
    const ActorLoad& a = actors_[actor];
    return a.alive && (max_in_flight_ == 0 || a.in_flight < max_in_flight_);
  }

  void set_alive(uint32_t actor, bool alive) { actors_[actor].alive = alive; }
  void increment(uint32_t actor) { ++actors_[actor].in_flight; }
  void decrement(uint32_t actor) { --actors_[actor].in_flight; }

  // Records that a call ran from started_s to ended_s. The service-time sample starts at the later
  // of its start and the actor's previous completion: when the actor was backlogged the call waited
  // behind others, and only the completion-to-completion interval is work. Samples that come out
  // negative (completions reported out of order) carry no information and are dropped.
  void record(uint32_t actor, double started_s, double ended_s, bool ok) {
    ActorLoad& a = actors_[actor];
    const double sample = ended_s - std::max(started_s, a.last_end_s);
    a.last_end_s = std::max(a.last_end_s, ended_s);
    if (!ok || sample < 0.0) return;
    if (!a.measured) {
      // The first sample moves the prior like any other: one lucky (or unlucky) call must not
      // make an actor look many times faster than the rest, or `sed` queues calls behind it.
      const double prior = prior_s_ > 0.0 ? prior_s_ : mean_ewma_or(sample);
      a.measured = true;
      a.ewma_s = prior + alpha_ * (sample - prior);
      ewma_sum_ += a.ewma_s;
      ++measured_;
    } else {
      const double old = a.ewma_s;
      a.ewma_s = old + alpha_ * (sample - old);
      ewma_sum_ += a.ewma_s - old;
    }
  }

  // Mean EWMA over measured actors, or `fallback` when none is measured. The sum is kept
  // incrementally (the reference does the same operations in the same order, so both round alike).
  double mean_ewma_or(double fallback) const {
    return measured_ == 0 ? fallback : ewma_sum_ / measured_;
  }

 private:
  std::vector<ActorLoad> actors_;
  uint32_t max_in_flight_;
  double alpha_;
  double prior_s_;  // the estimate a first sample moves from; 0: the mean of measured actors
  double ewma_sum_ = 0.0;
  uint32_t measured_ = 0;
};

}  // namespace actormesh
