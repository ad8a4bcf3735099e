// Several drivers: this driver's calls published to a table that the drivers of a host share,
// and the others' calls counted in every actor's load (shared_load.hpp).
#include "scheduler.hpp"

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace actormesh {

void Scheduler::share_load(const std::optional<std::string>& path) {
  std::lock_guard<std::mutex> lock(mutex_);
  loads_.share(nullptr);
  shared_.reset();  // a driver holds one row of a table at most
  shared_ = path ? std::make_unique<SharedLoad>(*path, loads_.size())
                 : std::make_unique<SharedLoad>(loads_.size());
  loads_.share(shared_.get());
  learn_others(true);
}

void Scheduler::unshare_load() {
  std::lock_guard<std::mutex> lock(mutex_);
  loads_.share(nullptr);
  shared_.reset();
  for (uint32_t a = 0; a < loads_.size(); ++a) {
    if (loads_[a].others == 0) continue;
    const Standing before = standing(a);
    loads_.set_others(a, 0);
    changed(a, before);
  }
}

void Scheduler::set_remote_load(const std::vector<uint32_t>& calls) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!shared_) throw std::logic_error("set_remote_load: the load of this mesh is not shared");
  shared_->set_remote(calls);
}

uint64_t Scheduler::load_table_id() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return shared_ ? shared_->table_id() : 0;
}

void Scheduler::learn_others(bool force) {
  if (!shared_ || !(force || shared_->due())) return;
  shared_->read(others_);
  for (uint32_t a = 0; a < loads_.size(); ++a) {
    if (others_[a] == loads_[a].others) continue;
    const Standing before = standing(a);
    loads_.set_others(a, others_[a]);
    changed(a, before);
  }
}

}  // namespace actormesh
