// Groups: the members of a mesh or of a view, registered once per member list and freed with
// their last user, so that views that are gone cost no decision anything.
#include "scheduler.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

namespace actormesh {

uint32_t Scheduler::add_group(const std::vector<int64_t>& members) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (members.empty()) throw std::invalid_argument("group members []: must not be empty");
  std::vector<uint32_t> sorted;
  sorted.reserve(members.size());
  for (int64_t actor : members) sorted.push_back(check_actor(actor));
  std::sort(sorted.begin(), sorted.end());
  const auto duplicate = std::adjacent_find(sorted.begin(), sorted.end());
  if (duplicate != sorted.end()) {
    throw std::invalid_argument("group members: actor " + std::to_string(*duplicate) +
                                " listed twice");
  }
  if (const auto known = group_ids_.find(sorted); known != group_ids_.end()) {
    Group& g = groups_[known->second];
    ++g.users;
    return known->second;
  }

  uint32_t id = static_cast<uint32_t>(groups_.size());
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
  }
  const uint32_t size = static_cast<uint32_t>(sorted.size());
  Group group;
  group.users = 1;
  group.policy = make_policy(policy_, size);
  for (uint32_t pos = 0; pos < size; ++pos) {
    const uint32_t actor = sorted[pos];
    const Standing now = standing(actor);
    group.live += now.live;
    group.eligible += now.eligible;
    group.healthy += now.healthy;
    group.rated += now.rated;
    group.rate += now.rate;
    group.pace += now.pace;
    if (now.preferred) {
      ++group.preferred;
      group.preferred_loads.add(now.in_flight);
    }
    group.policy->update(loads_, pos, actor, false, now.preferred);
    memberships_[actor].push_back({id, pos});
  }
  group.members = sorted;
  if (id == groups_.size()) {
    groups_.push_back(std::move(group));
  } else {
    groups_[id] = std::move(group);
  }
  group_ids_.emplace(std::move(sorted), id);
  return id;
}

void Scheduler::remove_group(int64_t group) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint32_t id = check_group(group);
  if (id == 0) throw std::invalid_argument("group 0 (every actor) cannot be removed");
  Group& g = groups_[id];
  if (g.users == 0) return;  // removed already; kept only for the calls still in its queue
  // Calls still queued need its members: then it goes when the last of them leaves the queue.
  if (--g.users == 0 && g.queue.empty()) free_group(id);
}

void Scheduler::free_if_unused(uint32_t group) {
  const Group& g = groups_[group];
  if (g.users == 0 && g.queue.empty() && !g.members.empty()) free_group(group);
}

// Drops a group: its members forget it, its id is reused. A group nobody uses costs nothing.
void Scheduler::free_group(uint32_t group) {
  Group& g = groups_[group];
  for (const uint32_t actor : g.members) {
    std::vector<Membership>& of_actor = memberships_[actor];
    of_actor.erase(std::remove_if(of_actor.begin(), of_actor.end(),
                                  [&](const Membership& m) { return m.group == group; }),
                   of_actor.end());
  }
  group_ids_.erase(g.members);
  g = Group{};
  free_ids_.push_back(group);
}

uint32_t Scheduler::num_groups() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<uint32_t>(groups_.size() - free_ids_.size());
}

std::vector<uint32_t> Scheduler::group_members(int64_t group) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return groups_[check_group(group)].members;
}

}  // namespace actormesh
