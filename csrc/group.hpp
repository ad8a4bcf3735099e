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

// A call that found no eligible member and waits for a slot.
struct QueuedCall {
  uint64_t ticket;
  std::optional<uint64_t> affinity;
};

struct Group {
  std::vector<uint32_t> members;  // actor ranks, ascending
  uint32_t alive = 0;             // members alive
  uint32_t eligible = 0;          // members alive with a free slot
  LoadHistogram eligible_loads;   // in_flight of the eligible members
  std::list<QueuedCall> queue;    // FIFO; non-empty only while `eligible` is 0
  std::unique_ptr<Policy> policy;
};

// Where an actor sits in one group it belongs to.
struct Membership {
  uint32_t group;
  uint32_t pos;  // index into that group's members
};

}  // namespace actormesh
