// Embedding, RMSNorm, RoPE and the gated activations on the GPU against the CPU references
// (src/kernels/cpu/*.cpp, compiled into this binary), in f32 and in bf16.
// Tolerances: f32 paths differ from the double references by f32 rounding only (1e-6 relative
// for one op, 1e-5 where a row of ~1000 values is summed); bf16 paths see the same bf16-rounded
// inputs as the reference and round once more on output: relative 2^-9 (~2e-3), so rtol 4e-3.
#include <algorithm>

#include "core/error.h"
#include "cuda_test_harness.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"

namespace ktune {
namespace {

using cuda_test::from_bf16;
using cuda_test::from_device;
using cuda_test::random_floats;
using cuda_test::rounded_to_bf16;
using cuda_test::to_bf16;
using cuda_test::to_device;

std::vector<int32_t> random_ids(int64_t n, int32_t V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = int32_t(rng() % uint32_t(V));
  return ids;
}

KTUNE_CUDA_TEST(EmbeddingForwardAndBackwardMatchCpu) {
  const int64_t V = 50, C = 96, N = 200;  // 200 tokens over 50 ids: the backward sums repeats
  const float scale = 1.5f;
  auto table = random_floats(static_cast<size_t>(V * C), 1);
  auto ids = random_ids(N, int32_t(V), 2);
  auto dout = random_floats(static_cast<size_t>(N * C), 3);
  std::vector<float> want(static_cast<size_t>(N * C));
  cpu::embedding_forward_reference(want.data(), ids.data(), table.data(), N, C, scale);
  auto dtable0 = random_floats(static_cast<size_t>(V * C), 4);
  auto want_dtable = dtable0;
  cpu::embedding_backward_reference(want_dtable.data(), dout.data(), ids.data(), N, C, scale);

  auto d_table = to_device(table), d_ids = to_device(ids), d_dout = to_device(dout), d_dtable = to_device(dtable0);
  cuda::DeviceBuffer d_out(want.size() * 4);
  cuda::IndexFlag flag;
  cuda::embedding_forward(d_out.as<float>(), d_ids.as<int32_t>(), d_table.as<float>(), N, C, V, scale, flag.data());
  cuda::embedding_backward(d_dtable.as<float>(), d_dout.as<float>(), d_ids.as<int32_t>(), N, C, V, scale, flag.data());
  auto got = from_device<float>(d_out, want.size());
  auto got_dtable = from_device<float>(d_dtable, want_dtable.size());
  CHECK_CLOSE(got.data(), want.data(), int64_t(want.size()), 0.0, 0.0);  // one f32 multiply: exact
  // f32 atomics add the ~4 repeats of an id in another order than the reference's loop: a few ulp
  // of sums up to ~6 (ulp 4.8e-7), so 4e-6 absolute; a lost or doubled token is off by ~0.5.
  CHECK_CLOSE(got_dtable.data(), want_dtable.data(), int64_t(want_dtable.size()), 4e-6, 1e-6);
  CHECK(flag.first_bad_row() == cuda::kNoBadIndex);

  // bf16 table and output: the reference's product rounded to bf16 is what the GPU must write.
  auto table_b = to_bf16(table);
  auto table_r = from_bf16(table_b);
  cpu::embedding_forward_reference(want.data(), ids.data(), table_r.data(), N, C, scale);
  auto want_b = rounded_to_bf16(want);
  auto d_table_b = to_device(table_b);
  cuda::DeviceBuffer d_out_b(want.size() * 2);
  cuda::embedding_forward(d_out_b.as<bf16_t>(), d_ids.as<int32_t>(), d_table_b.as<bf16_t>(), N, C, V, scale,
                          flag.data());
  auto got_b = from_bf16(from_device<bf16_t>(d_out_b, want.size()));
  CHECK_CLOSE(got_b.data(), want_b.data(), int64_t(want.size()), 0.0, 0.0);
}

KTUNE_CUDA_TEST(EmbeddingFlagsTheFirstIdOutsideTheTable) {
  const int64_t V = 10, C = 8, N = 6;
  std::vector<int32_t> ids = {1, 2, 10, 3, -1, 4};  // rows 2 and 4 are bad; 2 is the first
  auto table = random_floats(static_cast<size_t>(V * C), 5);
  auto d_table = to_device(table), d_ids = to_device(ids);
  cuda::DeviceBuffer d_out(static_cast<size_t>(N * C) * 4);
  cuda::IndexFlag flag;
  cuda::embedding_forward(d_out.as<float>(), d_ids.as<int32_t>(), d_table.as<float>(), N, C, V, 1.0f, flag.data());
  CHECK(flag.first_bad_row() == 2) << flag.first_bad_row();
  auto got = from_device<float>(d_out, size_t(N * C));
  for (int64_t c = 0; c < C; ++c) CHECK(got[size_t(2 * C + c)] == 0.0f && got[size_t(4 * C + c)] == 0.0f);
  bool threw = false;
  try {
    flag.check("embedding");
  } catch (const Error& e) {
    threw = std::string(e.what()).find("row 2") != std::string::npos;
  }
  CHECK(threw) << "IndexFlag::check must throw naming row 2";
  CHECK(flag.first_bad_row() == cuda::kNoBadIndex) << "check() resets the flag";
}

void check_rmsnorm_f32(float offset) {
  const int64_t N = 64, C = 1000;  // C not a multiple of the block: the tail columns count
  auto x = random_floats(static_cast<size_t>(N * C), 10, -2.0f, 2.0f), w = random_floats(static_cast<size_t>(C), 11);
  auto dy = random_floats(static_cast<size_t>(N * C), 12);
  std::vector<float> y(x.size()), rstd(static_cast<size_t>(N)), dx(x.size());
  auto dw0 = random_floats(static_cast<size_t>(C), 13);
  auto dw = dw0;
  cpu::rmsnorm_forward_reference(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f, offset);
  cpu::rmsnorm_backward_reference(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C, offset);

  auto d_x = to_device(x), d_w = to_device(w), d_dy = to_device(dy), d_dw = to_device(dw0);
  cuda::DeviceBuffer d_y(x.size() * 4), d_rstd(static_cast<size_t>(N) * 4), d_dx(x.size() * 4);
  cuda::rmsnorm_forward(d_y.as<float>(), d_rstd.as<float>(), d_x.as<float>(), d_w.as<float>(), N, C, 1e-5f, offset);
  cuda::rmsnorm_backward(d_dx.as<float>(), d_dw.as<float>(), d_dy.as<float>(), d_x.as<float>(), d_w.as<float>(),
                         d_rstd.as<float>(), N, C, offset);
  auto got_y = from_device<float>(d_y, y.size()), got_rstd = from_device<float>(d_rstd, rstd.size());
  auto got_dx = from_device<float>(d_dx, dx.size()), got_dw = from_device<float>(d_dw, dw.size());
  CHECK_CLOSE(got_rstd.data(), rstd.data(), N, 0.0, 2e-6) << "offset " << offset;
  CHECK_CLOSE(got_y.data(), y.data(), int64_t(y.size()), 1e-6, 1e-5) << "offset " << offset;
  CHECK_CLOSE(got_dx.data(), dx.data(), int64_t(dx.size()), 1e-5, 1e-4) << "offset " << offset;
  CHECK_CLOSE(got_dw.data(), dw.data(), C, 1e-5, 1e-5) << "offset " << offset;  // 64-row sums, += dw0
}

KTUNE_CUDA_TEST(RmsNormF32MatchesCpuReference) {
  check_rmsnorm_f32(0.0f);  // Llama
  check_rmsnorm_f32(1.0f);  // Gemma: x (1 + w)
}

KTUNE_CUDA_TEST(RmsNormBf16MatchesCpuReferenceOnRoundedInputs) {
  const int64_t N = 33, C = 2048;
  auto x = rounded_to_bf16(random_floats(static_cast<size_t>(N * C), 14, -2.0f, 2.0f));
  auto w = rounded_to_bf16(random_floats(static_cast<size_t>(C), 15));
  auto dy = rounded_to_bf16(random_floats(static_cast<size_t>(N * C), 16));
  std::vector<float> y(x.size()), rstd(static_cast<size_t>(N)), dx(x.size()), dw(static_cast<size_t>(C), 0.0f);
  cpu::rmsnorm_forward_reference(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6f, 0.0f);
  cpu::rmsnorm_backward_reference(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C, 0.0f);
  auto d_x = to_device(to_bf16(x)), d_w = to_device(to_bf16(w)), d_dy = to_device(to_bf16(dy));
  cuda::DeviceBuffer d_y(x.size() * 2), d_rstd(static_cast<size_t>(N) * 4), d_dx(x.size() * 2), d_dw(static_cast<size_t>(C) * 4);
  d_dw.zero();
  cuda::rmsnorm_forward(d_y.as<bf16_t>(), d_rstd.as<float>(), d_x.as<bf16_t>(), d_w.as<bf16_t>(), N, C, 1e-6f, 0.0f);
  cuda::rmsnorm_backward(d_dx.as<bf16_t>(), d_dw.as<float>(), d_dy.as<bf16_t>(), d_x.as<bf16_t>(), d_w.as<bf16_t>(),
                         d_rstd.as<float>(), N, C, 0.0f);
  auto got_y = from_bf16(from_device<bf16_t>(d_y, y.size())), got_dx = from_bf16(from_device<bf16_t>(d_dx, dx.size()));
  auto got_dw = from_device<float>(d_dw, dw.size());
  CHECK_CLOSE(got_y.data(), y.data(), int64_t(y.size()), 1e-5, 4e-3);
  // dx = a - b with |a|, |b| ~ 1: f32 cancellation error ~1e-6 absolute before the bf16 rounding.
  CHECK_CLOSE(got_dx.data(), dx.data(), int64_t(dx.size()), 1e-4, 4e-3);
  CHECK_CLOSE(got_dw.data(), dw.data(), C, 1e-5, 1e-5);  // dw is f32 from the same bf16 inputs
}

// The CPU RopeTable's cos/sin on the device.
struct DeviceRope {
  cuda::DeviceBuffer cos, sin;
  cuda::RopeTableView view;
  explicit DeviceRope(const cpu::RopeTable& t) {
    const size_t n = size_t(t.max_positions() * t.head_dim() / 2);
    cos = cuda::DeviceBuffer(n * 4);
    sin = cuda::DeviceBuffer(n * 4);
    cos.upload(t.cos(0), n * 4);
    sin.upload(t.sin(0), n * 4);
    view = {cos.as<float>(), sin.as<float>(), t.max_positions(), t.head_dim()};
  }
};

KTUNE_CUDA_TEST(RopeForwardAndBackwardMatchCpuReference) {
  cpu::RopeScaling llama3{"llama3", 32.0f, 1.0f, 4.0f, 8192};
  cpu::RopeTable table(64, 500000.0f, llama3, 4096);
  DeviceRope rope(table);
  const int64_t N = 40, H = 3, D = 64;
  auto x = random_floats(static_cast<size_t>(N * H * D), 20);
  auto pos = random_ids(N, 4096, 21);
  auto want = x;
  cpu::rope_forward_reference(want.data(), pos.data(), table, N, H, D);
  auto d_x = to_device(x), d_pos = to_device(pos);
  cuda::IndexFlag flag;
  cuda::rope_forward(d_x.as<float>(), d_pos.as<int32_t>(), rope.view, N, H, D, flag.data());
  auto got = from_device<float>(d_x, x.size());
  CHECK_CLOSE(got.data(), want.data(), int64_t(x.size()), 1e-6, 1e-6);
  // The backward is the inverse rotation: applied to the forward's output it gives x back.
  auto want_back = want;
  cpu::rope_backward_reference(want_back.data(), pos.data(), table, N, H, D);
  cuda::rope_backward(d_x.as<float>(), d_pos.as<int32_t>(), rope.view, N, H, D, flag.data());
  auto got_back = from_device<float>(d_x, x.size());
  CHECK_CLOSE(got_back.data(), want_back.data(), int64_t(x.size()), 1e-6, 1e-6);
  CHECK_CLOSE(got_back.data(), x.data(), int64_t(x.size()), 2e-6, 2e-6);
  CHECK(flag.first_bad_row() == cuda::kNoBadIndex);

  // bf16 in place, and a position outside the table flagged (row 5).
  auto xb = rounded_to_bf16(x);
  auto want_b = xb;
  cpu::rope_forward_reference(want_b.data(), pos.data(), table, N, H, D);
  pos[5] = 4096;
  for (int64_t i = 0; i < H * D; ++i) want_b[size_t(5 * H * D + i)] = xb[size_t(5 * H * D + i)];  // left unrotated
  auto d_xb = to_device(to_bf16(xb)), d_pos_bad = to_device(pos);
  cuda::rope_forward(d_xb.as<bf16_t>(), d_pos_bad.as<int32_t>(), rope.view, N, H, D, flag.data());
  auto got_b = from_bf16(from_device<bf16_t>(d_xb, x.size()));
  CHECK_CLOSE(got_b.data(), want_b.data(), int64_t(x.size()), 1e-6, 4e-3);
  CHECK(flag.first_bad_row() == 5) << flag.first_bad_row();
}

template <typename Fwd, typename Bwd, typename CudaFwd, typename CudaBwd>
void check_gate(const char* name, Fwd ref_fwd, Bwd ref_bwd, CudaFwd gpu_fwd, CudaBwd gpu_bwd, bool bf16) {
  const int64_t n = 10007;
  auto gate = random_floats(static_cast<size_t>(n), 30, -4.0f, 4.0f), up = random_floats(static_cast<size_t>(n), 31, -2.0f, 2.0f);
  auto dout = random_floats(static_cast<size_t>(n), 32, -2.0f, 2.0f);
  if (bf16) gate = rounded_to_bf16(gate), up = rounded_to_bf16(up), dout = rounded_to_bf16(dout);
  std::vector<float> out(static_cast<size_t>(n)), dgate(static_cast<size_t>(n)), dup(static_cast<size_t>(n));
  ref_fwd(out.data(), gate.data(), up.data(), n);
  ref_bwd(dgate.data(), dup.data(), dout.data(), gate.data(), up.data(), n);
  std::vector<float> got_out, got_dgate, got_dup;
  if (!bf16) {
    auto g = to_device(gate), u = to_device(up), d = to_device(dout);
    cuda::DeviceBuffer o(static_cast<size_t>(n) * 4), dg(static_cast<size_t>(n) * 4), du(static_cast<size_t>(n) * 4);
    gpu_fwd(o.as<float>(), g.as<float>(), u.as<float>(), n);
    gpu_bwd(dg.as<float>(), du.as<float>(), d.as<float>(), g.as<float>(), u.as<float>(), n);
    got_out = from_device<float>(o, size_t(n)), got_dgate = from_device<float>(dg, size_t(n));
    got_dup = from_device<float>(du, size_t(n));
  } else {
    auto g = to_device(to_bf16(gate)), u = to_device(to_bf16(up)), d = to_device(to_bf16(dout));
    cuda::DeviceBuffer o(static_cast<size_t>(n) * 2), dg(static_cast<size_t>(n) * 2), du(static_cast<size_t>(n) * 2);
    gpu_fwd(o.as<bf16_t>(), g.as<bf16_t>(), u.as<bf16_t>(), n);
    gpu_bwd(dg.as<bf16_t>(), du.as<bf16_t>(), d.as<bf16_t>(), g.as<bf16_t>(), u.as<bf16_t>(), n);
    got_out = from_bf16(from_device<bf16_t>(o, size_t(n))), got_dgate = from_bf16(from_device<bf16_t>(dg, size_t(n)));
    got_dup = from_bf16(from_device<bf16_t>(du, size_t(n)));
    // In place, as the GPU decoder's backward runs it: dgate over gate, dup over up, the same values.
    auto gi = to_device(to_bf16(gate)), ui = to_device(to_bf16(up));
    gpu_bwd(gi.as<bf16_t>(), ui.as<bf16_t>(), d.as<bf16_t>(), gi.as<bf16_t>(), ui.as<bf16_t>(), n);
    const auto in_place_dgate = from_bf16(from_device<bf16_t>(gi, size_t(n)));
    const auto in_place_dup = from_bf16(from_device<bf16_t>(ui, size_t(n)));
    CHECK_CLOSE(in_place_dgate.data(), got_dgate.data(), n, 0.0, 0.0) << name << " in place";
    CHECK_CLOSE(in_place_dup.data(), got_dup.data(), n, 0.0, 0.0) << name << " in place";
  }
  // f32: expf/tanhf are within 2 ulp; the GELU derivative cancels near g = -0.75 (1e-6 of |terms| ~ 8).
  const double rtol = bf16 ? 4e-3 : 1e-5, atol = bf16 ? 2e-5 : 1e-5;
  CHECK_CLOSE(got_out.data(), out.data(), n, atol, rtol) << name << (bf16 ? " bf16" : " f32");
  CHECK_CLOSE(got_dgate.data(), dgate.data(), n, atol, rtol) << name << (bf16 ? " bf16" : " f32");
  CHECK_CLOSE(got_dup.data(), dup.data(), n, atol, rtol) << name << (bf16 ? " bf16" : " f32");
}

KTUNE_CUDA_TEST(SwigluAndGegluTanhMatchCpuReferenceInF32AndBf16) {
  for (bool bf16 : {false, true}) {
    check_gate(
        "swiglu", cpu::swiglu_forward_reference, cpu::swiglu_backward_reference,
        [](auto* o, auto* g, auto* u, int64_t n) { cuda::swiglu_forward(o, g, u, n); },
        [](auto* dg, auto* du, auto* d, auto* g, auto* u, int64_t n) { cuda::swiglu_backward(dg, du, d, g, u, n); },
        bf16);
    check_gate(
        "geglu_tanh", cpu::geglu_tanh_forward_reference, cpu::geglu_tanh_backward_reference,
        [](auto* o, auto* g, auto* u, int64_t n) { cuda::geglu_tanh_forward(o, g, u, n); },
        [](auto* dg, auto* du, auto* d, auto* g, auto* u, int64_t n) { cuda::geglu_tanh_backward(dg, du, d, g, u, n); },
        bf16);
  }
}

}  // namespace
}  // namespace ktune
