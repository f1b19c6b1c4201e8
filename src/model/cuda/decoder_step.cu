// cuda::Decoder's step: the batch's upload, the forward (embedding, layers, final norm), the fused
// loss, the backward down to the embedding (with checkpointing's recompute, offloading's copies and
// the ZeRO hooks), and forward_backward / forward_loss around them.
#include "model/cuda/decoder_impl.h"

namespace ktune::cuda {

using namespace decoder_internal;

namespace {

// y += x (bf16, added in f32, rounded once): the residual's gradient.
__global__ void add_inplace_kernel(__nv_bfloat16* y, const __nv_bfloat16* x, int64_t n) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __float2bfloat16_rn(__bfloat162float(y[i]) + __bfloat162float(x[i]));
}

void add_inplace(bf16_t* y, const bf16_t* x, int64_t n) {
  add_inplace_kernel<<<blocks_for(n, 256), 256>>>(dev(y), dev(x), n);
  KTUNE_CUDA_CHECK_LAUNCH();
}

// w for the rows of x from `first` on (a slice of the micro-batch): DoRA's saved pre-activations and
// LoRA dropout's mask indices move with the rows.
LinearRef rows_from(LinearRef w, int64_t first) {
  if (w.pre) w.pre += first * w.out;
  w.dropout_first = first * w.in;
  return w;
}

// p + n, or nullptr for nullptr (an optional buffer, offset to a slice of rows).
template <typename T>
T* offset(T* p, int64_t n) {
  return p ? p + n : nullptr;
}

// Profiling events: 0/1 the step, 2/3 the loss, 4 + 6l + {0,1} layer l's attention forward, + {2,3} its
// backward, + {4,5} checkpointing's second forward of it.
size_t attn_event(int64_t l, int k) { return size_t(4 + 6 * l + k); }

}  // namespace

void Decoder::Impl::set_step_shape(int64_t batch, int64_t seq_len) {
  check(seq_len >= 0 && seq_len <= T_max, "cuda decoder",
        "a step of seq_len " + std::to_string(seq_len) + " for a decoder planned for at most " + std::to_string(T_max));
  check(batch >= 0 && batch <= B_max, "cuda decoder",
        "a step of " + std::to_string(batch) + " rows for a decoder planned for at most " + std::to_string(B_max));
  T = seq_len > 0 ? seq_len : T_max;
  B = batch > 0 ? batch : B_max;
  N = B * T;
  for (Layer& layer : layers) layer.attention.B = B, layer.attention.T = T;
}

void Decoder::Impl::upload_batch(const DecoderConfig& c, const int32_t* tokens_host, const int32_t* labels_host,
                                 const int32_t* positions_host, const int32_t* doc_ids_host) {
  copy_to_device(tokens, tokens_host, size_t(N) * sizeof(int32_t));
  copy_to_device(labels, labels_host, size_t(N) * sizeof(int32_t));
  step_docs = nullptr;
  step_bounds = DocumentBounds{};
  step_host_bounds = HostDocumentBounds{};
  if (doc_ids_host) {
    copy_to_device(doc_ids, doc_ids_host, size_t(N) * sizeof(int32_t));
    step_docs = doc_ids;
    host_first_key.resize(size_t(N));
    host_last_query.resize(size_t(N));
    document_bounds(host_first_key.data(), host_last_query.data(), doc_ids_host, B, T);
    copy_to_device(doc_first_key, host_first_key.data(), size_t(N) * sizeof(int32_t));
    copy_to_device(doc_last_query, host_last_query.data(), size_t(N) * sizeof(int32_t));
    step_bounds = DocumentBounds{doc_first_key, doc_last_query};
    step_host_bounds = HostDocumentBounds{host_first_key.data(), host_last_query.data()};
  }
  if (positions_host) {
    // A sample split across packs continues its count past T: the table grows as the CPU one does
    // (to twice its rows at least); a negative position is the rope kernel's to flag.
    const int32_t highest = *std::max_element(positions_host, positions_host + N);
    if (highest >= rope_rows) build_rope_table(c, std::max<int64_t>(int64_t(highest) + 1, 2 * rope_rows));
    copy_to_device(positions, positions_host, size_t(N) * sizeof(int32_t));
    positions_T = positions_B = 0;  // no longer 0..T-1: the next step without positions lays them out again
    return;
  }
  if (positions_T == T && positions_B >= B) return;  // 0..T-1 in every row already
  std::vector<int32_t> pos(static_cast<size_t>(N));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) pos[size_t(b * T + t)] = int32_t(t);
  copy_to_device(positions, pos.data(), pos.size() * sizeof(int32_t));
  positions_T = T, positions_B = B;
}

void Decoder::Impl::forward(const DecoderConfig& c, bool for_backward) {
  const int64_t C = c.hidden_size, V = c.vocab_size, L = c.num_layers;
  // Offloading: input j (resid[j]) claims its slot before it is written and is sent to the host
  // (if a later input takes the slot) once it is.
  if (offloading) offload.claim(0);
  embedding_forward(resid[0], tokens, P(embed).value, N, C, V, embed_scale, index_flag->data());
  if (offloading) offload.stored(0, N * C, for_backward);
  for (int64_t l = 0; l < L; ++l) {
    // ZeRO-3: layer l's weights in their slot (gathered now only where no prefetch brought them), and
    // layer l + 1's gather enqueued into the other slot, to run while layer l computes.
    if (sharded_weights()) {
      use_weights(l);
      if (l + 1 < L && prefetching()) prefetch_weights(l + 1);
    }
    if (offloading) offload.claim(l + 1);
    layer_forward(c, l, resid[size_t(l)], resid[size_t(l) + 1]);
    if (offloading) offload.stored(l + 1, N * C, for_backward);
  }
  rmsnorm_forward(final_normed, final_rstd, resid[size_t(L)], P(final_norm).value, N, C, c.rms_norm_eps,
                  c.norm_weight_offset);
}

// Layer l from x_in to x_out, saving into acts[l]. With activation checkpointing the backward runs
// both halves again for layer l (attention_half with recompute = true, the MLP a chunk of rows at a
// time in mlp_rows_backward): the same kernels on the same input and parameters, the dropout masks
// from the same key, so acts[l] holds what the first forward saved there, bit for bit; the MLP's
// output rows then go to scratch (the backward no longer reads the next layer's input, whose offload
// slot may be taking another layer's input back by then).
void Decoder::Impl::layer_forward(const DecoderConfig& c, int64_t l, const bf16_t* x_in, bf16_t* x_out) {
  attention_half(c, l, x_in, false);
  mlp_forward(c, l, x_out);
}

// x_in .. h (x_mid) = x + [post_attn_norm](o(attention(...))), then ln2 = norm2(h).
void Decoder::Impl::attention_half(const DecoderConfig& c, int64_t l, const bf16_t* x_in, bool recompute) {
  const int64_t C = c.hidden_size;
  const int64_t Hq = c.num_heads, Hkv = c.num_kv_heads, D = c.head_dim;
  const RopeTableView rope{rope_cos.as<float>(), rope_sin.as<float>(), rope_rows, D};
  const float eps = c.rms_norm_eps, off = c.norm_weight_offset;
  const Layer& layer = layers[size_t(l)];
  const Acts& a = acts[size_t(l)];
  rmsnorm_forward(a.ln1, a.rstd1, x_in, P(layer.norm_attn).value, N, C, eps, off);
  linear_forward(a.q, a.ln1, lin(layer.proj[kQ]), a.xa[kQ], 0.0f);
  linear_forward(a.k, a.ln1, lin(layer.proj[kK]), a.xa[kK], 0.0f);
  linear_forward(a.v, a.ln1, lin(layer.proj[kV]), a.xa[kV], 0.0f);
  rope_forward(a.q, positions, rope, N, Hq, D, index_flag->data());
  rope_forward(a.k, positions, rope, N, Hkv, D, index_flag->data());
  mark(attn_event(l, recompute ? 4 : 0));
  if (layer.kernel == TrainingSetup::Attention::kTensorCore)
    flash_attention_tc_forward(a.att, a.lse, a.q, a.k, a.v, layer.attention, nullptr, step_docs, step_bounds);
  else if (layer.kernel == TrainingSetup::Attention::kGemm)
    attention_gemm_forward(gemm, a.att, a.lse, a.q, a.k, a.v, layer.attention, attn_gemm_scratch, nullptr, step_docs,
                           step_host_bounds);
  else
    attention_forward(a.att, a.lse, a.q, a.k, a.v, step_docs, step_bounds, layer.attention);
  mark(attn_event(l, recompute ? 5 : 1));
  if (recompute) attention_recompute_ran[size_t(l)] = true;
  if (c.sandwich_norms) {  // h = x + post_attn_norm(o(att))
    linear_forward(a.o, a.att, lin(layer.proj[kO]), a.xa[kO], 0.0f);
    rmsnorm_forward(a.x_mid, a.rstd_o, a.o, P(layer.norm_attn_out).value, N, C, eps, off);
    add_inplace(a.x_mid, x_in, N * C);
  } else {  // h = x + o(att): x copied into h, the projection accumulated onto it (beta = 1)
    KTUNE_CUDA_CHECK(cudaMemcpyAsync(a.x_mid, x_in, size_t(N * C) * 2, cudaMemcpyDeviceToDevice, nullptr));
    linear_forward(a.x_mid, a.att, lin(layer.proj[kO]), a.xa[kO], 1.0f);
  }
  rmsnorm_forward(a.ln2, a.rstd2, a.x_mid, P(layer.norm_mlp).value, N, C, eps, off);
}

// y = h + [post_ff_norm](down(act(gate(ln2)) * up(ln2))), mlp_rows rows at a time.
void Decoder::Impl::mlp_forward(const DecoderConfig& c, int64_t l, bf16_t* x_out) {
  const int64_t chunk = mlp_chunked ? mlp_rows : N;
  for (int64_t first = 0; first < N; first += chunk) mlp_rows_forward(c, l, first, std::min(chunk, N - first), x_out);
}

void Decoder::Impl::mlp_rows_forward(const DecoderConfig& c, int64_t l, int64_t first, int64_t rows, bf16_t* x_out) {
  const int64_t C = c.hidden_size, I = c.intermediate_size, r = lora_rank;
  const float eps = c.rms_norm_eps, off = c.norm_weight_offset;
  const Layer& layer = layers[size_t(l)];
  const Acts& a = acts[size_t(l)];
  const RowScope scope(*this, rows);
  const bf16_t* ln2 = a.ln2 + first * C;  // (rows, C)
  bf16_t* y = x_out + first * C;          // (rows, C)
  const bf16_t* h = a.x_mid + first * C;  // (rows, C)
  linear_forward(a.gate, ln2, rows_from(lin(layer.proj[kGate]), first), offset(a.xa[kGate], first * r), 0.0f);
  linear_forward(a.up, ln2, rows_from(lin(layer.proj[kUp]), first), offset(a.xa[kUp], first * r), 0.0f);
  if (c.activation == DecoderConfig::Activation::kSiLU) swiglu_forward(a.act, a.gate, a.up, rows * I);
  else geglu_tanh_forward(a.act, a.gate, a.up, rows * I);
  const LinearRef down = rows_from(lin(layer.proj[kDown]), first);
  if (c.sandwich_norms) {  // y = h + post_ff_norm(mlp)
    bf16_t* d = a.down + first * C;
    linear_forward(d, a.act, down, offset(a.xa[kDown], first * r), 0.0f);
    rmsnorm_forward(y, a.rstd_down + first, d, P(layer.norm_mlp_out).value, rows, C, eps, off);
    add_inplace(y, h, rows * C);
  } else {
    KTUNE_CUDA_CHECK(cudaMemcpyAsync(y, h, size_t(rows * C) * 2, cudaMemcpyDeviceToDevice, nullptr));
    linear_forward(y, a.act, down, offset(a.xa[kDown], first * r), 1.0f);  // y = h + mlp
  }
}

// d act over act, then d gate and d up over gate and up: nothing reads them after this in the step
// (the next forward, or checkpointing's recompute, writes them again), and linear_backward reads
// its x before it writes dx: 3 (rows, I) bf16 buffers fewer.
void Decoder::Impl::mlp_rows_backward(const DecoderConfig& c, int64_t l, int64_t first, int64_t rows) {
  const int64_t C = c.hidden_size, I = c.intermediate_size, r = lora_rank;
  const float off = c.norm_weight_offset;
  const Layer& layer = layers[size_t(l)];
  const Acts& a = acts[size_t(l)];
  // Chunked: these rows' gate, up, act (and LoRA's x A^T, DoRA's pre-activations, the post-ff norm's
  // input) again; their output goes into dln's rows, which this chunk's backward writes last.
  if (mlp_chunked) mlp_rows_forward(c, l, first, rows, dln);
  const RowScope scope(*this, rows);
  const bf16_t* dy = dres + first * C;  // (rows, C)
  bf16_t* dln_rows = dln + first * C;
  const bf16_t* ln2 = a.ln2 + first * C;
  if (c.sandwich_norms) {  // dtmp's rows = d down, read by down's backward before anything rewrites them
    bf16_t* d_down = dtmp + first * C;
    rmsnorm_backward(d_down, P(layer.norm_mlp_out).grad, dy, a.down + first * C, P(layer.norm_mlp_out).value,
                     a.rstd_down + first, rows, C, off);
    dy = d_down;
  }
  bf16_t* dact = a.act;
  linear_backward(dact, false, dy, a.act, rows_from(lin(layer.proj[kDown]), first), offset(a.xa[kDown], first * r));
  bf16_t* dgate = a.gate;
  bf16_t* dup = a.up;
  if (c.activation == DecoderConfig::Activation::kSiLU)
    swiglu_backward(dgate, dup, dact, a.gate, a.up, rows * I);
  else
    geglu_tanh_backward(dgate, dup, dact, a.gate, a.up, rows * I);
  linear_backward(dln_rows, false, dgate, ln2, rows_from(lin(layer.proj[kGate]), first),
                  offset(a.xa[kGate], first * r));
  linear_backward(dln_rows, true, dup, ln2, rows_from(lin(layer.proj[kUp]), first), offset(a.xa[kUp], first * r));
}

// The output projection fused with cross-entropy over final_normed. backward: dnormed (N, C) f32
// overwritten with grad_scale * d(sum)/d(final_normed) and the head's gradients accumulated (W's when
// it trains; A's and B's with LoRA on lm_head); otherwise neither is touched. LoRA on lm_head follows
// LoraAdapter::fused_output_cross_entropy: xa = x' A^T once for all N rows, the low-rank term inside
// each chunk (linear_cross_entropy's LoraHead), then through xa after the loss.
void Decoder::Impl::loss(const DecoderConfig& c, float grad_scale, bool backward) {
  const DeviceParameter& h = P(head);
  mark(2);
  const bool adapted = output.lora_a >= 0;
  const LinearRef w = adapted ? lin(output) : LinearRef{h.value, h.grad};
  if (w.m) head_dora_norms(w);  // before x' (head_lora_forward): both use the projections' scratch
  LoraHead lora = adapted ? head_lora_forward(w, backward) : LoraHead{};
  if (w.nf4_codes) {  // QLoRA on lm_head: W dequantised a block of rows at a time inside the loss
    lora.nf4_codes = w.nf4_codes, lora.nf4_scales = w.nf4_scales;
    lora.nf4_block_rows = head_rows, lora.nf4_block = head_weight;
  }
  linear_cross_entropy_enqueue(gemm, backward ? dnormed : nullptr, backward ? h.grad : nullptr, final_normed,
                               w.nf4_codes ? nullptr : h.value, lora, labels, N, c.hidden_size, c.vocab_size,
                               c.final_logit_softcap, grad_scale, ce_chunk, ce_scratch, loss_totals_at.data());
  if (backward && adapted) head_lora_backward(w);
  mark(3);
}

// The loss's sum and count, which the pass left on the device (loss_totals_at): read once
// the step has been enqueued whole, so the host never waits between the forward and the backward.
StepResult Decoder::Impl::loss_totals(const DecoderConfig& c) {
  const CrossEntropyTotals totals = linear_cross_entropy_totals(loss_totals_at.data(), c.vocab_size);  // synchronises
  StepResult result;
  result.loss_sum = totals.loss_sum;
  result.n_valid = totals.n_valid;
  return result;
}

// xa (N, r) = x' A^T, x' = dropout(final_normed) with LoRA dropout (module "lm_head", element n C + i
// of the (N, C) rows, the CPU adapter's masks), else final_normed. DoRA: c and the norms; with
// dropout x' stays through the loss (head_dropped), for PEFT's base terms h W^T − x' W^T + c ⊙ x' W^T.
LoraHead Decoder::Impl::head_lora_forward(const LinearRef& w, bool backward) {
  const bf16_t* x = final_normed;
  const bool dora_dropout = w.m && w.dropout > 0;
  if (w.dropout > 0) {
    bf16_t* xd = dora_dropout ? head_dropped : dropped_x;
    lora_dropout_forward(xd, final_normed, N * w.in, w.dropout_seed, w.dropout);
    x = xd;
  }
  mm(false, true, N, w.r, w.in, 1.0f, x, w.a, 0.0f, head_xa, DType::BF16);
  LoraHead lora;
  lora.rank = w.r, lora.scale = w.scale, lora.b = w.b, lora.xa = head_xa;
  if (backward) lora.dxa = lora_g, lora.db = w.db;  // dxa (N, r) in lora_g, until the layers' backward
  if (w.m) {
    lora.dora_scale = w.c, lora.weight_norm = w.norm;
    if (backward) lora.dmagnitude = w.dm;
  }
  if (dora_dropout) {
    lora.dropped_hidden = head_dropped;
    if (backward) lora.ddropped_hidden = head_ddropped;
  }
  return lora;
}

// DoRA on lm_head (the CPU adapter's compute_dora_scale): ‖W + s B A‖ per vocabulary row and
// c = m / that into w.norm, w.c (V), head_rows rows at a time (an NF4 W's rows dequantised first).
void Decoder::Impl::head_dora_norms(const LinearRef& w) {
  for (int64_t v0 = 0; v0 < w.out; v0 += head_rows) {
    const int64_t n = std::min(head_rows, w.out - v0);
    const bf16_t* rows = nf4_weight;
    if (w.nf4_codes)
      nf4_dequantize(nf4_weight, w.nf4_codes + v0 * w.in / 2, w.nf4_scales + v0 * w.in / cpu::kNf4BlockSize,
                     n * w.in);
    else
      rows = w.w + v0 * w.in;
    dora_norm_rows(w, rows, v0, n);
  }
}

// Undoes xa = x' A^T from the loss's dxa (lora_g): dA += dxa^T x'; dnormed += mask ⊙ (dxa A) / (1 - p)
// (without dropout x' = final_normed and dnormed += dxa A, in f32).
void Decoder::Impl::head_lora_backward(const LinearRef& w) {
  const bf16_t* x = final_normed;
  if (w.m && w.dropout > 0) {  // DoRA: x' kept; dnormed += mask ⊙ (the loss's ((c − 1) ⊙ dz) W + dxa A) / (1 - p)
    mm(true, false, w.r, w.in, N, 1.0f, lora_g, head_dropped, 1.0f, w.da, DType::F32);
    mm(false, false, N, w.in, w.r, 1.0f, lora_g, w.a, 1.0f, head_ddropped, DType::F32);
    lora_dropout_backward_add(dnormed, head_ddropped, N * w.in, w.dropout_seed, w.dropout);
    return;
  }
  if (w.dropout > 0) {  // x' again
    lora_dropout_forward(dropped_x, final_normed, N * w.in, w.dropout_seed, w.dropout);
    x = dropped_x;
  }
  mm(true, false, w.r, w.in, N, 1.0f, lora_g, x, 1.0f, w.da, DType::F32);
  if (w.dropout <= 0) {
    mm(false, false, N, w.in, w.r, 1.0f, lora_g, w.a, 1.0f, dnormed, DType::F32);
    return;
  }
  mm(false, false, N, w.in, w.r, 1.0f, lora_g, w.a, 0.0f, dropped_x, DType::BF16);  // d x' = dxa A
  lora_dropout_backward_add(dnormed, dropped_x, N * w.in, w.dropout_seed, w.dropout);
}

// below[l]: whether the embedding or a layer under layer l has anything trainable, so that layer l
// must give its input's gradient (below[L]: whether any layer or the embedding trains).
std::vector<bool> Decoder::Impl::trainable_below(const DecoderConfig& c) {
  const int64_t L = c.num_layers;
  std::vector<bool> below(size_t(L) + 1, false);
  below[0] = P(embed).grad != nullptr;
  for (int64_t l = 0; l < L; ++l) {
    const Layer& layer = layers[size_t(l)];
    bool any = false;
    for (int norm : {layer.norm_attn, layer.norm_mlp, layer.norm_attn_out, layer.norm_mlp_out})
      any = any || (norm >= 0 && P(norm).grad);
    for (const auto& pr : layer.proj)
      any = any || P(pr.weight).grad || (pr.bias >= 0 && P(pr.bias).grad) || pr.lora_a >= 0;
    below[size_t(l) + 1] = below[size_t(l)] || any;
  }
  return below;
}

void Decoder::Impl::backward(const DecoderConfig& c) {
  const int64_t C = c.hidden_size, V = c.vocab_size, L = c.num_layers;
  attention_backward_ran.assign(size_t(L), false);
  attention_recompute_ran.assign(size_t(L), false);
  const std::vector<bool> below = trainable_below(c);
  const DeviceParameter& fnorm = P(final_norm);
  if (!below[size_t(L)] && !fnorm.grad) return;
  convert_to_bf16(dtmp, dnormed, N * C);
  if (offloading) offload.acquire(L);  // the final norm's input never left its slot
  rmsnorm_backward(dres, fnorm.grad, dtmp, resid[size_t(L)], fnorm.value, final_rstd, N, C, c.norm_weight_offset);
  reduce_unit(L + 1);  // the final norm's and an untied head's gradients are complete
  for (int64_t l = L - 1; l >= 0; --l) {
    if (!below[size_t(l) + 1]) break;  // nothing trainable in this layer or below
    ready_layer_for_backward(c, l, below[size_t(l)]);
    layer_backward(c, l, below[size_t(l)] || P(layers[size_t(l)].norm_attn).grad);
    reduce_unit(1 + l);  // layer l's gradients are complete: its slot's reduce-scatter enqueued
  }
  const DeviceParameter& e = P(embed);
  if (reducing_units && whole_units_shared) {  // unit L + 1's piece added, its buffer zeroed for unit 0
    settle(channel_of(0));
    const Decoder::GradientUnit& unit = (*grad_units)[0];
    KTUNE_CUDA_CHECK(cudaMemsetAsync(unit.grads, 0, size_t(unit.size) * 4, nullptr));
  }
  if (e.grad) embedding_backward(e.grad, dres, tokens, N, C, V, embed_scale, index_flag->data());
  reduce_unit(0);  // the last: its piece is added by settle_all once the backward returns
}

// What layer l's backward needs in place first; more_below: the backward goes on to layer l - 1.
void Decoder::Impl::ready_layer_for_backward(const DecoderConfig& c, int64_t l, bool more_below) {
  // ZeRO-3: layer l's weights in their slot for checkpointing's recompute and the backward both (the
  // forward's last two layers are still there), and layer l - 1's gather enqueued into the other
  // slot, to run while layer l computes, if the loop goes on to layer l - 1.
  if (sharded_weights()) {
    use_weights(l);
    if (l > 0 && more_below && prefetching()) prefetch_weights(l - 1);
  }
  // Offloading: input l back in its slot (its trip began a layer ago), and input l - 1's trip
  // begun now, behind this layer's work, if the loop goes on to layer l - 1.
  if (offloading) offload.acquire(l);
  if (offloading && l > 0 && more_below) offload.prefetch(l - 1, N * c.hidden_size);
  // Checkpointing: the layer's attention half again, from its saved input (the MLP runs again
  // chunk by chunk in mlp_rows_backward); the last layer's too: the loss's scratch lay over it.
  if (checkpointing) attention_half(c, l, resid[size_t(l)], true);
  // ZeRO-2: layer l's gradient slot (layer l + 2's until now) free once layer l + 2's reduce-scatter
  // is done and its piece added into the accumulator, then zeroed for layer l's gradients (as late
  // as this: the recompute above writes no gradient, and runs while that reduce-scatter does).
  if (reducing_units) {
    const int k = int(l % kGradSlots);
    settle(k);
    KTUNE_CUDA_CHECK(cudaMemsetAsync(grad_slot[k], 0, grad_slot_bytes, nullptr));
  }
}

// Layer l's backward from dres (d of its output) to dres (d of its input; need_dx false: not wanted),
// its parameters' gradients accumulated.
void Decoder::Impl::layer_backward(const DecoderConfig& c, int64_t l, bool need_dx) {
  const int64_t C = c.hidden_size, Hq = c.num_heads, Hkv = c.num_kv_heads, D = c.head_dim;
  const RopeTableView rope{rope_cos.as<float>(), rope_sin.as<float>(), rope_rows, D};
  const float off = c.norm_weight_offset;
  const Layer& layer = layers[size_t(l)];
  const Acts& a = acts[size_t(l)];
  const bf16_t* x_in = resid[size_t(l)];
  // Undo y = h + [post_ff_norm](down(act(gate(n)) * up(n))), n = norm2(h): dln = d n, then d h.
  const int64_t chunk = mlp_chunked ? mlp_rows : N;
  for (int64_t first = 0; first < N; first += chunk) mlp_rows_backward(c, l, first, std::min(chunk, N - first));
  rmsnorm_backward(dtmp, P(layer.norm_mlp).grad, dln, a.x_mid, P(layer.norm_mlp).value, a.rstd2, N, C, off);
  add_inplace(dres, dtmp, N * C);  // dres = d h
  // Undo h = x + [post_attn_norm](o(attention(rope(q(n)), rope(k(n)), v(n)))), n = norm1(x)
  const bf16_t* dy_o = dres;
  if (c.sandwich_norms) {  // dtmp = d o, read by o's backward before norm1's backward rewrites dtmp
    rmsnorm_backward(dtmp, P(layer.norm_attn_out).grad, dres, a.o, P(layer.norm_attn_out).value, a.rstd_o, N, C,
                     off);
    dy_o = dtmp;
  }
  linear_backward(datt, false, dy_o, a.att, lin(layer.proj[kO]), a.xa[kO]);
  mark(attn_event(l, 2));
  if (layer.kernel == TrainingSetup::Attention::kTensorCore)
    flash_attention_tc_backward(dq, dk, dv, datt, a.q, a.k, a.v, a.att, a.lse, layer.attention, attn_tc_scratch,
                                nullptr, step_docs, step_bounds);
  else if (layer.kernel == TrainingSetup::Attention::kGemm)
    attention_gemm_backward(gemm, dq, dk, dv, datt, a.q, a.k, a.v, a.att, a.lse, layer.attention, attn_gemm_scratch,
                            nullptr, step_docs, step_host_bounds);
  else
    attention_backward(dq, dk, dv, datt, a.q, a.k, a.v, a.att, a.lse, step_docs, step_bounds, layer.attention,
                       attn_scratch);
  mark(attn_event(l, 3));
  attention_backward_ran[size_t(l)] = true;
  rope_backward(dq, positions, rope, N, Hq, D, index_flag->data());
  rope_backward(dk, positions, rope, N, Hkv, D, index_flag->data());
  bf16_t* dx = need_dx ? dln : nullptr;
  linear_backward(dx, false, dq, a.ln1, lin(layer.proj[kQ]), a.xa[kQ]);
  linear_backward(dx, true, dk, a.ln1, lin(layer.proj[kK]), a.xa[kK]);
  linear_backward(dx, true, dv, a.ln1, lin(layer.proj[kV]), a.xa[kV]);
  if (!need_dx) return;
  rmsnorm_backward(dtmp, P(layer.norm_attn).grad, dln, x_in, P(layer.norm_attn).value, a.rstd1, N, C, off);
  add_inplace(dres, dtmp, N * C);  // dres = d x
}

// The end of a pass: the index flag's check (synchronises) and, when profiling, the times.
void Decoder::Impl::finish_step(const DecoderConfig& c, bool with_backward, Decoder::StepProfile* profile) {
  mark(1);
  index_flag->check("cuda decoder: token id or rotary position");  // synchronises
  if (!profiling) return;
  KTUNE_CUDA_CHECK(cudaEventSynchronize(events[1]));
  *profile = StepProfile{};
  profile->step_ms = between(0, 1);
  profile->loss_ms = between(2, 3);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    profile->attention_ms += between(attn_event(l, 0), attn_event(l, 1));
    if (with_backward && attention_backward_ran[size_t(l)])
      profile->attention_ms += between(attn_event(l, 2), attn_event(l, 3));
    if (with_backward && attention_recompute_ran[size_t(l)])
      profile->attention_ms += between(attn_event(l, 4), attn_event(l, 5));
  }
}

StepResult Decoder::forward_backward(const int32_t* tokens_host, const int32_t* labels_host, float grad_scale,
                                     int64_t seq_len, const int32_t* positions, const int32_t* doc_ids, int64_t batch) {
  Impl& s = *impl_;
  s.set_step_shape(batch, seq_len);
  s.upload_batch(config_, tokens_host, labels_host, positions, doc_ids);
  s.dropping = setup_.lora_dropout > 0;
  const int64_t gemm_calls_before = s.gemm.calls();
  s.mark(0);
  s.forward(config_, true);
  // shard_gradients: the whole units hold this micro-batch's gradients only (the accumulators sum
  // the micro-batches), so they start at zero; each layer zeroes its slot before its backward.
  s.reducing_units = false;
  s.forget_reduces();  // nothing pending (settled at the end of each pass, or a throw's leftovers)
  if (setup_.shard_gradients) {
    check(bool(gradient_reduce_.enqueue) && bool(gradient_reduce_.wait_all), "cuda decoder",
          "shard_gradients: no gradient reduce set (set_gradient_reduce) to reduce the gradients");
    for (int64_t u : {config_.num_layers + 1, int64_t(0)}) {
      if (u == 0 && s.whole_units_shared) continue;  // zeroed by the backward once unit L + 1 is reduced
      KTUNE_CUDA_CHECK(cudaMemsetAsync(units_[size_t(u)].grads, 0, size_t(units_[size_t(u)].size) * 4, nullptr));
    }
    s.reducing_units = true;
  }
  s.loss(config_, grad_scale, true);  // enqueued: its sum stays on the device until the step's end
  const auto backward_start = std::chrono::steady_clock::now();
  s.backward(config_);
  s.settle_all();            // the pieces still pending (the last layers', units L + 1's and 0's)
  const double backward_host_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - backward_start).count();
  s.reducing_units = false;
  s.wait_for_collectives();  // before finish_step's host synchronisation
  s.finish_step(config_, true, &profile_);
  const StepResult result = s.loss_totals(config_);
  if (s.profiling) {
    profile_.gemm_calls = s.gemm.calls() - gemm_calls_before;
    profile_.backward_host_ms = backward_host_ms;
    profile_.backward_device_ms = s.between(3, 1);
  }
  return result;
}

StepResult Decoder::forward_loss(const int32_t* tokens_host, const int32_t* labels_host, int64_t seq_len,
                                 const int32_t* positions, const int32_t* doc_ids, int64_t batch) {
  Impl& s = *impl_;
  s.set_step_shape(batch, seq_len);
  s.upload_batch(config_, tokens_host, labels_host, positions, doc_ids);
  s.dropping = false;  // evaluation: no dropout
  s.mark(0);
  s.forward(config_, false);
  s.loss(config_, 0.0f, false);
  s.wait_for_collectives();  // the forward's gathers, before finish_step's host synchronisation
  s.finish_step(config_, false, &profile_);
  return s.loss_totals(config_);
}

void Decoder::set_dropout_key(uint64_t key) { impl_->dropout_key = key; }

}  // namespace ktune::cuda
