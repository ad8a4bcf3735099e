// The calls other drivers have in flight on each actor of a mesh that several drivers share.
//
// Every driver's scheduler counts its own calls exactly; what the other drivers have in flight it
// learns here, without a remote call per decision and with no process in between. Drivers on
// one host share a table in shared memory (a file under /dev/shm): one row per driver, written
// by that driver alone (its calls in flight per actor, one relaxed atomic store per change), and
// summed by the others during a decision, at most once per refresh period, which tunes itself so
// that reading stays near 1% of the time (a few hundred microseconds for a small mesh). Counts of
// drivers on other hosts come from outside (`set_remote`): learnt off the hot path, where the
// table's id (`table_id`) tells the drivers of one host from those of another.
//
// Who counts and who keeps the file, told by open-file-description locks, which the kernel drops
// with the process whatever killed it:
// - a driver holds the lock on its row's byte; a reader that finds a row marked live but
//   unlocked (its driver died without leaving) stops counting it;
// - every process that uses the file holds a read lock on its users byte. The last to leave
//   takes it for writing and removes the file; a table whose users all died is removed by
//   their janitor (actormesh/_janitor.py) the same way; a joiner that finds the file removed
//   under it opens the new one.
// A fork copies the file descriptions, and with them the locks: a child that outlived its
// parent would keep a dead driver's row counted and its file in place. So a forked child lets
// go of every table of its parent (pthread_atfork): its copy neither counts nor holds a lock.
#pragma once

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace actormesh {

class SharedLoad {
 public:
  static constexpr uint32_t kRows = 64;  // drivers of one mesh on one host
  // The byte of the file whose read lock every user holds (bytes 0..kRows-1 lock the rows).
  static constexpr off_t kUsersByte = kRows;
  // At byte 4 of every table of this layout: what a janitor removes (actormesh/_janitor.py).
  static constexpr uint32_t kMagic = 0x316d6174;

  // Only counts set by set_remote: a driver with no table (shared memory unavailable), alone
  // in a table of its own as far as `table_id` tells.
  explicit SharedLoad(uint32_t num_actors)
      : num_actors_(num_actors), remote_(num_actors, 0), table_id_(fresh_id()) {}

  // Maps the table at `path` for `num_actors` actors, creating it if this driver is the first,
  // and claims a free row. Throws std::runtime_error naming the path on any failure.
  SharedLoad(const std::string& path, uint32_t num_actors)
      : num_actors_(num_actors), remote_(num_actors, 0), path_(path) {
    stride_ = (num_actors * sizeof(uint32_t) + kLine - 1) / kLine * kLine;
    size_ = kLine + kRows * kLine + static_cast<size_t>(kRows) * stride_;
    Tables& tables = all_tables();
    std::lock_guard<std::mutex> guard(tables.mutex);  // a fork waits until fd_ is known
    join();
    struct stat st {};
    if (::fstat(fd_, &st) != 0) fail("fstat");
    // Every opener sizes a new (empty) file alike: whoever comes first, it ends up this size.
    if (st.st_size == 0 && ::ftruncate(fd_, static_cast<off_t>(size_)) != 0) fail("ftruncate");
    if (st.st_size != 0 && static_cast<size_t>(st.st_size) != size_) {
      close();
      throw std::runtime_error("shared load table " + path + " has " +
                               std::to_string(st.st_size) + " bytes, not the " +
                               std::to_string(size_) + " of a table for " +
                               std::to_string(num_actors) + " actors");
    }
    void* base = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (base == MAP_FAILED) fail("mmap");
    base_ = static_cast<unsigned char*>(base);
    uint32_t no_magic = 0;
    if (!magic()->compare_exchange_strong(no_magic, kMagic) && no_magic != kMagic) {
      close();
      throw std::runtime_error("shared load table " + path +
                               " is not a table of this version of actormesh");
    }
    uint32_t expected = 0;
    if (!header()->compare_exchange_strong(expected, num_actors) && expected != num_actors) {
      close();
      throw std::runtime_error("shared load table " + path + " is for " +
                               std::to_string(expected) + " actors, not " +
                               std::to_string(num_actors));
    }
    // The first driver names the table; every driver of it reads the same id.
    uint64_t no_id = 0;
    id()->compare_exchange_strong(no_id, fresh_id());
    table_id_ = id()->load();
    for (uint32_t row = 0; row < kRows && row_ < 0; ++row) {
      if (lock(row, F_OFD_SETLK, F_WRLCK)) {
        row_ = static_cast<int32_t>(row);
      } else if (errno != EAGAIN && errno != EACCES) {
        fail("fcntl(F_OFD_SETLK)");
      }
    }
    if (row_ < 0) {
      close();
      throw std::runtime_error("shared load table " + path + ": every one of its " +
                               std::to_string(kRows) + " rows is taken by a live driver");
    }
    for (uint32_t a = 0; a < num_actors_; ++a) count(row_, a).store(0, std::memory_order_relaxed);
    generation(row_).fetch_add(1, std::memory_order_relaxed);
    live(row_).store(1, std::memory_order_release);
    stale_.assign(kRows, 0);
    tables.open.insert(this);
  }

  // Leaves the table: this driver's row counts nothing from now on, and the last user removes
  // the file.
  ~SharedLoad() {
    Tables& tables = all_tables();
    std::lock_guard<std::mutex> guard(tables.mutex);
    tables.open.erase(this);
    if (base_ != nullptr) {
      for (uint32_t a = 0; a < num_actors_; ++a) count(row_, a).store(0, std::memory_order_relaxed);
      live(row_).store(0, std::memory_order_release);
      // No other user holds the users byte when this one can lock it for writing.
      if (lock(kUsersByte, F_OFD_SETLK, F_WRLCK) && linked()) ::unlink(path_.c_str());
    }
    close();
  }

  SharedLoad(const SharedLoad&) = delete;
  SharedLoad& operator=(const SharedLoad&) = delete;

  // Tells the drivers that share this table (one host) from the drivers that do not.
  uint64_t table_id() const { return table_id_; }

  // This driver now has `calls` calls in flight on `actor`.
  void publish(uint32_t actor, uint32_t calls) {
    if (base_ != nullptr) count(row_, actor).store(calls, std::memory_order_relaxed);
  }

  // Calls of drivers on other hosts, per actor; read from the next refresh on.
  void set_remote(const std::vector<uint32_t>& calls) {
    if (calls.size() != num_actors_) {
      throw std::invalid_argument("remote load of " + std::to_string(calls.size()) +
                                  " actors for a mesh of " + std::to_string(num_actors_));
    }
    remote_ = calls;
    next_s_ = 0.0;
  }

  // Whether a refresh is due: the period has passed since the last one, or counts came in.
  bool due() const { return now_s() >= next_s_; }

  // The other drivers' calls per actor: every other live row of the table plus the remote
  // counts. Sets the next refresh so that reading takes ~1% of the time.
  void read(std::vector<uint32_t>& out) {
    const double start = now_s();
    out = remote_;
    if (base_ != nullptr) {
      if (start >= next_check_s_) check_rows(start);
      for (uint32_t row = 0; row < kRows; ++row) {
        if (static_cast<int32_t>(row) == row_ || live(row).load(std::memory_order_acquire) == 0 ||
            stale_[row] == generation(row).load(std::memory_order_relaxed)) {
          continue;
        }
        for (uint32_t a = 0; a < num_actors_; ++a) {
          out[a] += count(row, a).load(std::memory_order_relaxed);
        }
      }
    }
    const double end = now_s();
    next_s_ = end + std::max(kMinPeriodS, kPeriodPerRead * (end - start));
  }

 private:
  static constexpr size_t kLine = 64;
  static constexpr double kMinPeriodS = 0.0002;
  static constexpr double kPeriodPerRead = 100.0;  // the period is 100 times a read's cost
  static constexpr double kCheckS = 1.0;           // how often rows are checked for dead owners
  static constexpr int kJoinAttempts = 1000;       // 1 ms apart

  // The tables this process has open, so that a forked child can let go of them.
  struct Tables {
    std::mutex mutex;
    std::set<SharedLoad*> open;
  };

  static Tables& all_tables() {
    // Never destroyed: a table may be left during the destruction of statics.
    static Tables* tables = [] {
      Tables* made = new Tables;
      pthread_atfork([] { all_tables().mutex.lock(); }, [] { all_tables().mutex.unlock(); },
                     [] {
                       Tables& forked = all_tables();
                       for (SharedLoad* table : forked.open) table->close();
                       forked.open.clear();
                       forked.mutex.unlock();
                     });
      return made;
    }();
    return *tables;
  }

  static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  [[noreturn]] void fail(const char* what) {
    const std::string message =
        "shared load table " + path_ + ": " + what + " failed: " + std::strerror(errno);
    close();
    throw std::runtime_error(message);
  }

  void close() {
    if (base_ != nullptr) ::munmap(base_, size_);
    base_ = nullptr;
    if (fd_ >= 0) ::close(fd_);  // drops this driver's locks (unless a fork copied them)
    fd_ = -1;
  }

  // Opens the file at path_ as one of its users: a read lock on its users byte, on the file
  // still named path_ (a leaver or a janitor may remove it between the open and the lock).
  void join() {
    for (int attempt = 0; attempt < kJoinAttempts; ++attempt) {
      fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
      if (fd_ < 0) fail("open");
      if (lock(kUsersByte, F_OFD_SETLK, F_RDLCK)) {
        if (linked()) return;
      } else if (errno != EAGAIN && errno != EACCES) {
        fail("fcntl(F_OFD_SETLK)");
      }
      ::close(fd_);  // removed, or being removed: open the file that takes its place
      fd_ = -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    throw std::runtime_error("shared load table " + path_ + " was being removed each of the " +
                             std::to_string(kJoinAttempts) + " times it was opened");
  }

  // Whether the open file is still the one named path_.
  bool linked() const {
    struct stat opened {};
    struct stat named {};
    return ::fstat(fd_, &opened) == 0 && opened.st_nlink > 0 &&
           ::stat(path_.c_str(), &named) == 0 && opened.st_dev == named.st_dev &&
           opened.st_ino == named.st_ino;
  }

  // Takes (F_OFD_SETLK) or tests (F_OFD_GETLK) the lock on one byte of the file.
  bool lock(off_t byte, int command, short type) const {
    struct flock fl {};
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = byte;
    fl.l_len = 1;
    if (::fcntl(fd_, command, &fl) != 0) return false;
    return command == F_OFD_SETLK || fl.l_type == F_UNLCK;
  }

  // Marks as stale the live rows whose owner is gone (their lock is free).
  void check_rows(double now) {
    next_check_s_ = now + kCheckS;
    for (uint32_t row = 0; row < kRows; ++row) {
      if (static_cast<int32_t>(row) == row_ || live(row).load(std::memory_order_acquire) == 0) {
        continue;
      }
      const uint32_t gen = generation(row).load(std::memory_order_relaxed);
      if (lock(row, F_OFD_GETLK, F_WRLCK)) stale_[row] = gen;
    }
  }

  static uint64_t fresh_id() {
    std::random_device source;
    const uint64_t id = (static_cast<uint64_t>(source()) << 32) | source();
    return id == 0 ? 1 : id;
  }

  std::atomic<uint32_t>* header() const { return reinterpret_cast<std::atomic<uint32_t>*>(base_); }
  std::atomic<uint32_t>* magic() const {
    return reinterpret_cast<std::atomic<uint32_t>*>(base_ + 4);
  }
  std::atomic<uint64_t>* id() const { return reinterpret_cast<std::atomic<uint64_t>*>(base_ + 8); }
  std::atomic<uint32_t>& live(uint32_t row) const {
    return reinterpret_cast<std::atomic<uint32_t>*>(base_ + kLine + row * kLine)[0];
  }
  std::atomic<uint32_t>& generation(uint32_t row) const {
    return reinterpret_cast<std::atomic<uint32_t>*>(base_ + kLine + row * kLine)[1];
  }
  std::atomic<uint32_t>& count(int32_t row, uint32_t actor) const {
    unsigned char* counts = base_ + kLine + kRows * kLine + static_cast<size_t>(row) * stride_;
    return reinterpret_cast<std::atomic<uint32_t>*>(counts)[actor];
  }

  uint32_t num_actors_;
  std::vector<uint32_t> remote_;
  uint64_t table_id_ = 0;
  std::string path_;
  int fd_ = -1;
  unsigned char* base_ = nullptr;
  size_t size_ = 0;
  size_t stride_ = 0;
  int32_t row_ = -1;
  // Per row, the generation found stale (its owner died); 0 (no generation) is never stale.
  std::vector<uint32_t> stale_;
  double next_s_ = 0.0;
  double next_check_s_ = 0.0;
};

static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free,
              "shared-memory counters must be lock-free to be shared between processes");

}  // namespace actormesh
