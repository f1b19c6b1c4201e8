// The attention kernels' GPU tests on the host emulator: flash_attention_tc_test.cpp is compiled in
// as it is (its cases, its tolerances, its four steps: tc vs the CPU reference, tc vs the tiled
// kernel, and each backward fed the other kernel's forward), together with attention_test.cpp (the
// tiled kernel's cases) in their own translation unit, against the real flash_attention_tc.cu and
// attention.cu rewritten by rewrite.py. On the emulator those full cases take ~40 s, so this file
// adds a reduced set for CI that calls the same check on smaller shapes covering the same paths:
// both head dims, GQA and MHA, B > 1, partial tiles, one row, and a peaked softmax over several key
// tiles (the running max rises). CTest runs every case but the real file's three shape cases; the binary without
// an argument runs everything (see CMakeLists.txt).
// It deliberately writes no expectation of its own: check_flash_attention_tc is the GPU test's.
#include "flash_attention_tc_test.cpp"

namespace ktune {
namespace {

KTUNE_CUDA_TEST(EmulatedTensorCoreAttentionD64) {
  check_flash_attention_tc("D64 gqa 2:1 B2 T70", shape(2, 70, 4, 2, 64));  // one full 64-tile + 6
  check_flash_attention_tc("D64 one row", shape(1, 1, 2, 1, 64));
}

KTUNE_CUDA_TEST(EmulatedTensorCoreAttentionD128) {
  check_flash_attention_tc("D128 gqa 2:1 T77", shape(1, 77, 2, 1, 128));  // backward key tiles of 128: a partial one
}

KTUNE_CUDA_TEST(EmulatedTensorCoreAttentionPeakedSoftmax) {
  check_flash_attention_tc("D64 peaked 1:1 T150", shape(1, 150, 1, 1, 64), 6.0f);  // three key tiles
}

}  // namespace
}  // namespace ktune
