// Philox4x32-10 (Salmon et al., SC 2011; Random123's philox4x32_10, cuRAND's Philox4_32_10) and the float64
// uniform that per_sample_philox draws from it. Torch-free device code; the PyTorch reference is
// cuda_ext/reference/philox.py, and both give the same bits (known-answer and kernel-against-reference tests).
#pragma once

#include <cstdint>

namespace cuda_ext {

struct PhiloxWords {
  uint32_t x0, x1, x2, x3;
};

__device__ __forceinline__ PhiloxWords philox4x32_10(PhiloxWords c, uint32_t k0, uint32_t k1) {
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {  // the key is bumped between rounds
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const uint32_t lo0 = 0xD2511F53u * c.x0;
    const uint32_t hi0 = __umulhi(0xD2511F53u, c.x0);
    const uint32_t lo1 = 0xCD9E8D57u * c.x2;
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c.x2);
    c = PhiloxWords{hi1 ^ c.x1 ^ k0, lo1, hi0 ^ c.x3 ^ k1, lo0};
  }
  return c;
}

// Draw i of the generator state (seed, counter): counter words (lo(i), hi(i), lo(counter), hi(counter)),
// key (lo(seed), hi(seed)); 53 bits of the first two output words, ((x0 >> 5) * 2^26 + (x1 >> 6)) * 2^-53.
__device__ __forceinline__ double philox_uniform(uint64_t seed, uint64_t counter, uint64_t i) {
  const PhiloxWords words = philox4x32_10(
      PhiloxWords{static_cast<uint32_t>(i), static_cast<uint32_t>(i >> 32), static_cast<uint32_t>(counter),
                  static_cast<uint32_t>(counter >> 32)},
      static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return (static_cast<double>(words.x0 >> 5) * 67108864.0 + static_cast<double>(words.x1 >> 6)) *
         (1.0 / 9007199254740992.0);
}

}  // namespace cuda_ext
