// Decision cost measured entirely in C++, for benchmarks/decision_cost.py.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <stdexcept>
#include <string>

#include "scheduler.hpp"

namespace actormesh {

// Nanoseconds per decision, where a decision is one submit plus the complete of the oldest call
// in flight: every call costs both. About num_actors / 2 calls stay in flight throughout (a busy
// mesh rather than an idle one), and completions carry synthetic times 1 us apart so the EWMA,
// and with it `sed`, sees real samples.
inline double measure_decision_ns(const std::string& policy, uint32_t num_actors,
                                  uint64_t decisions, uint64_t seed) {
  if (policy == "external") {
    throw std::invalid_argument("policy 'external' needs a Python picker; measure it from Python");
  }
  SchedulerConfig config;
  config.num_actors = num_actors;
  config.policy = policy;
  config.seed = seed;
  Scheduler scheduler(std::move(config));
  std::deque<int32_t> running;
  double clock_s = 0.0;
  for (uint32_t i = 0; i < num_actors / 2; ++i) running.push_back(scheduler.submit(0, {}).actor);
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t i = 0; i < decisions; ++i) {
    running.push_back(scheduler.submit(0, {}).actor);
    clock_s += 1e-6;
    scheduler.complete(running.front(), clock_s - 1e-5, clock_s, true);
    running.pop_front();
  }
  const auto elapsed = std::chrono::steady_clock::now() - start;
  return std::chrono::duration<double, std::nano>(elapsed).count() / static_cast<double>(decisions);
}

}  // namespace actormesh
