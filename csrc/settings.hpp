// The scheduler's settings, spelled once: this list makes the C++ struct and its defaults, and
// bindings.cpp makes from it the Python keyword arguments of `Scheduler` and `SETTINGS` (every
// default by name). What each one means: API.md; how each is checked: settings.cpp.
#pragma once

#include <cstdint>
#include <string>

#include "picker.hpp"

namespace actormesh {

// X(type, name, default) for every setting. (Comments here must be /* */: a macro is one line.)
#define ACTORMESH_SETTINGS(X)                                                                   \
  X(std::string, policy, "pow2")                                                                \
  X(int64_t, max_in_flight, 0)        /* calls per actor; 0: unbounded (pull: 0 means 1) */     \
  X(int64_t, max_tasks, 0)            /* Ray tasks per actor; 0: unbounded */                   \
  X(double, pipeline_s, 0.0)          /* a task beyond the first while calls are this short */  \
  X(bool, pipeline_backlog, false)    /* a second task while calls back up in a group */        \
  X(int64_t, coalesce, 1)             /* calls one task may carry; 1: never batch */            \
  X(double, batch_budget_s, 0.002)    /* expected duration of one batch */                      \
  X(double, hold_ratio, 0.0)          /* hold calls back from actors this many x slower */      \
  X(uint64_t, seed, 0)                /* of the random policies */                              \
  X(double, ewma_alpha, 0.2)          /* weight of one sample in the moving averages */         \
  X(double, prior_s, 0.0)             /* what an unmeasured actor takes (sed); 0: the mean */   \
  X(int64_t, affinity_abs, 2)         /* a key leaves an actor this many calls over ... */      \
  X(double, affinity_rel, 1.5)        /* ... and this many times over the least loaded */       \
  X(int64_t, affinity_capacity, 65536) /* keys remembered, least recently used forgotten */     \
  X(bool, sticky, true)               /* false: keys only reach the picker */                   \
  X(int64_t, eject_after, 0)          /* failed calls in a row that eject an actor; 0: never */ \
  X(double, eject_base_s, 1.0)        /* the first ejection's length, doubled when it recurs */ \
  X(double, eject_max_s, 30.0)        /* ... up to this */

struct Settings {
#define ACTORMESH_SETTING_MEMBER(type, name, value) type name = value;
  ACTORMESH_SETTINGS(ACTORMESH_SETTING_MEMBER)
#undef ACTORMESH_SETTING_MEMBER
  Picker picker;  // not a setting but the `external` policy's callback: when set, that policy
};

// `settings` checked for a mesh of `num_actors` (std::invalid_argument naming the bad value),
// with the defaults that depend on the policy filled in.
Settings validated(Settings settings, int64_t num_actors);

// A double as an error message shows it (shortest form).
std::string format_double(double value);

}  // namespace actormesh
