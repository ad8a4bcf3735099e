// A group: the members of a mesh or sub-mesh view, their queue and their policy's index.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <vector>

#include "load_histogram.hpp"
#include "policy.hpp"

namespace actormesh {

// A call that found no eligible member and waits for a slot. `payload` is the caller's, opaque to
// the core (the binding stores a Python object there), and handed back with the call.
struct QueuedCall {
  uint64_t ticket;
  std::optional<uint64_t> affinity;
  uint64_t payload;
  uint32_t method = 0;  // whose service time it is expected to take
  bool alone = false;   // never rides a batch (its method says so, or its caller)
};

struct Group {
  std::vector<uint32_t> members;  // actor ranks, ascending
  uint32_t live = 0;              // members alive or restarting
  uint32_t eligible = 0;          // members alive with a free slot
  uint32_t preferred = 0;         // eligible members not ejected: what the policy picks among
  // Members alive and not ejected, free or not: while there is one, a call waits for it rather
  // than go to an ejected member.
  uint32_t healthy = 0;
  LoadHistogram preferred_loads;  // in_flight of the preferred members
  // The members whose speed is known (alive, not ejected, measured beyond start-up): how many,
  // and the sum of their speeds (1 / low_s), i.e. the calls per second they serve together.
  uint32_t rated = 0;
  double rate = 0.0;
  double pace = 0.0;  // the same sum over their mean times (ewma_s): how fast they are typically
  // FIFO. Non-empty while `eligible` is 0; or while its first call is held back from an
  // eligible straggler (`holding`); or for an instant between a completion and the drain it
  // defers (a Python picker must not run on the thread that completes calls).
  std::list<QueuedCall> queue;
  // The first call is held back from an eligible straggler, at the latest until `hold_until`
  // (the scheduler's clock): then it goes to the straggler, even if no faster actor has freed.
  // (Scheduler::holds.)
  bool holding = false;
  double hold_until = 0.0;
  std::unique_ptr<Policy> policy;
  uint32_t users = 0;  // add_group calls not yet matched by remove_group; at 0 with calls
                       // queued, it stays (for them) until its queue is empty
};

// Where an actor sits in one group it belongs to.
struct Membership {
  uint32_t group;
  uint32_t pos;  // index into that group's members
};

}  // namespace actormesh
