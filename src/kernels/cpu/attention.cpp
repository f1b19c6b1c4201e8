// Tiled causal attention with an online softmax (see attention.h).
// FIRST VERSION: forwards to the reference while the tiled kernel is written.
#include "kernels/cpu/attention.h"

namespace ktune::cpu {

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const int32_t* doc_ids, const AttentionShape& s) {
  attention_forward_reference(out, lse, q, k, v, doc_ids, s);
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                        const float* v, const float* out, const float* lse, const int32_t* doc_ids,
                        const AttentionShape& s) {
  attention_backward_reference(dq, dk, dv, dout, q, k, v, out, lse, doc_ids, s);
}

}  // namespace ktune::cpu
