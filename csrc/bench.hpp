// Decision cost measured entirely in C++, for benchmarks/decision_cost.py.
#pragma once

#include <time.h>

#include <cstdint>
#include <deque>
#include <stdexcept>
#include <string>
#include <utility>

#include "scheduler.hpp"

namespace actormesh {

// CPU time of the calling thread: other processes on a shared machine do not inflate it.
inline int64_t thread_cpu_ns() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
}

// Nanoseconds of thread CPU time per decision, where a decision is one submit plus the complete
// of the oldest call in flight: every call costs both. num_actors / 2 calls stay in flight
// throughout (a busy mesh, not an idle one), and completions carry synthetic times 1 us apart so
// that the EWMA, and with it `sed`, sees real samples.
inline double measure_decision_ns(const std::string& policy, uint32_t num_actors,
                                  uint64_t decisions, uint64_t seed) {
  if (policy == "external") {
    throw std::invalid_argument("policy 'external' needs a Python picker; measure it from Python");
  }
  if (decisions == 0) throw std::invalid_argument("decisions 0: must be >= 1");
  Settings settings;
  settings.policy = policy;
  settings.seed = seed;
  Scheduler scheduler(num_actors, std::move(settings));
  std::deque<int32_t> running;
  for (uint32_t i = 0; i < num_actors / 2; ++i) running.push_back(scheduler.submit(0, {}).actor);
  double clock_s = 0.0;
  const int64_t start = thread_cpu_ns();
  for (uint64_t i = 0; i < decisions; ++i) {
    running.push_back(scheduler.submit(0, {}).actor);
    clock_s += 1e-6;
    scheduler.complete(running.front(), clock_s - 1e-5, clock_s, 0);
    running.pop_front();
  }
  return static_cast<double>(thread_cpu_ns() - start) / static_cast<double>(decisions);
}

}  // namespace actormesh
