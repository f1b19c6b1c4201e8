// The counter-based random bits that must come out the same on every engine: splitmix64 (Steele,
// Lea and Flood's step and finaliser), a uniform float in [0, 1) from (seed, index) with 24 bits of
// resolution (and a double with 53, for the sampler), and FNV-1a of a name (a hash that, unlike
// std::hash, never changes between builds).
// Header-only; under nvcc the first two are __host__ __device__, so the CPU and the GPU draw LoRA
// dropout masks, stochastic roundings and initialisations from this one definition.
#pragma once

#include <cstdint>
#include <string_view>

#if defined(__CUDACC__)
#define KTUNE_HOST_DEVICE __host__ __device__
#else
#define KTUNE_HOST_DEVICE
#endif

namespace ktune {

KTUNE_HOST_DEVICE inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [0, 1): the top 24 bits of splitmix64(seed ^ splitmix64(index)).
KTUNE_HOST_DEVICE inline float uniform01(uint64_t seed, uint64_t index) {
  return float(splitmix64(seed ^ splitmix64(index)) >> 40) * (1.0f / 16777216.0f);
}

// Uniform in [0, 1) with a double's 53 bits: the top 53 bits of the same splitmix64 value (the
// sampler's draws, where 24 bits could not tell apart tokens of probability below 2^-24).
inline double uniform01_double(uint64_t seed, uint64_t index) {
  return double(splitmix64(seed ^ splitmix64(index)) >> 11) * (1.0 / 9007199254740992.0);
}

// FNV-1a, 64-bit.
inline uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

}  // namespace ktune
