// The scheduler's random source: SplitMix64, small enough to mirror exactly in Python.
#pragma once

#include <cstdint>

namespace actormesh {

// GCC and Clang provide 128-bit integers on 64-bit targets; __extension__ keeps -Wpedantic quiet.
__extension__ using uint128 = unsigned __int128;

// SplitMix64 (Steele, Lea, Flood 2014). The state starts at the seed and advances by the golden
// gamma on every draw. benchmarks/reference.py implements the same two functions, so a native
// scheduler and the reference make identical picks for the same seed and event sequence.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  uint64_t next() {
    state_ += 0x9E3779B97F4A7C15ULL;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }

  // Uniform index in [0, n) by multiply-high: (next() * n) >> 64. One draw per call, no
  // rejection, so Python reproduces it as `(next() * n) >> 64`; the bias is below n / 2^64.
  uint32_t below(uint32_t n) {
    return static_cast<uint32_t>((static_cast<uint128>(next()) * n) >> 64);
  }

 private:
  uint64_t state_;
};

}  // namespace actormesh
