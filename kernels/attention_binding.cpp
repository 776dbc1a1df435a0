// torch binding of the launchers in fused_launchers.h (attention.cu, attention_mma.cu,
// attention_mma_bwd.cu, cross_entropy.cu): checks devices, dtypes and layouts, allocates the
// outputs, passes the current CUDA stream.  Built on demand (GPU machines only) by
// scaletrain/ops/attention_cuda.py; scaletrain.ops has already flattened the shapes: attention to
// (batch * heads, seq, head_dim), cross-entropy to (rows, vocab).
#include <torch/extension.h>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <tuple>
#include <utility>

#include "fused_launchers.h"

namespace {

int st_dtype(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return ST_FLOAT32;
    case at::kHalf: return ST_FLOAT16;
    case at::kBFloat16: return ST_BFLOAT16;
    default: TORCH_CHECK(false, "scaletrain cuda kernels: dtype ", t.scalar_type(),
                         " is not supported; use float32, float16 or bfloat16");
  }
}

void check_like(const at::Tensor& t, const at::Tensor& ref, int64_t dim, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.device() == ref.device(), name, " must be a CUDA tensor on ", ref.device());
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), name, " must have dtype ", ref.scalar_type());
  TORCH_CHECK(t.dim() == dim && t.is_contiguous(), name, " must be a contiguous ", dim, "-d tensor");
}

void check_launch(int err, const char* what) {
  TORCH_CHECK(err == 0, what, " launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
}

// Two kernels each way: attention_mma*.cu's on tensor cores (fp16 / bf16 at head dim 64 or 128,
// aligned, on sm_80+) and attention.cu's scalar ones (everything else).  kAuto picks the first
// where it applies.
enum class Kernel { kAuto, kScalar, kMma };

bool sm80(const at::Tensor& q) { return at::cuda::getDeviceProperties(q.get_device())->major >= 8; }

bool mma_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& o) {
  return sm80(q) && st_attention_fwd_mma_supported(st_dtype(q), q.size(2), q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                                   o.data_ptr());
}

bool mma_bwd_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& o,
                     const at::Tensor& d_o) {
  return sm80(q) && st_attention_bwd_mma_supported(st_dtype(q), q.size(2), q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                                   o.data_ptr(), d_o.data_ptr());
}

std::tuple<at::Tensor, at::Tensor> attention_fwd_with(Kernel kernel, const at::Tensor& q, const at::Tensor& k,
                                                      const at::Tensor& v, bool causal, double scale) {
  check_like(q, q, 3, "q");
  check_like(k, q, 3, "k");
  check_like(v, k, 3, "v");
  TORCH_CHECK(k.size(0) == q.size(0) && k.size(2) == q.size(2) && v.sizes() == k.sizes(),
              "attention: q (bh, seq_q, d), k and v (bh, seq_k, d)");
  TORCH_CHECK(q.size(2) <= 128, "attention: head_dim <= 128, got ", q.size(2));
  const c10::cuda::CUDAGuard guard(q.device());
  at::Tensor o = at::empty_like(q);
  at::Tensor lse = at::empty({q.size(0), q.size(1)}, q.options().dtype(at::kFloat));
  const bool mma = kernel == Kernel::kMma || (kernel == Kernel::kAuto && mma_applies(q, k, v, o));
  TORCH_CHECK(!mma || mma_applies(q, k, v, o), "attention_fwd_mma: the tensor-core kernel needs fp16 or bf16 at "
              "head dim 64 or 128 on sm_80+ (16-byte aligned k, v); got ", q.scalar_type(), ", head dim ", q.size(2));
  const auto launcher = mma ? st_attention_fwd_mma : st_attention_fwd;
  check_launch(launcher(st_dtype(q), q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr<float>(),
                        q.size(0), q.size(1), k.size(1), q.size(2), static_cast<float>(scale), causal,
                        c10::cuda::getCurrentCUDAStream().stream()),
               mma ? "attention forward (tensor cores)" : "attention forward");
  return {o, lse};
}

std::tuple<at::Tensor, at::Tensor> attention_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                 bool causal, double scale) {
  return attention_fwd_with(Kernel::kAuto, q, k, v, causal, scale);
}

std::tuple<at::Tensor, at::Tensor> attention_fwd_scalar(const at::Tensor& q, const at::Tensor& k,
                                                        const at::Tensor& v, bool causal, double scale) {
  return attention_fwd_with(Kernel::kScalar, q, k, v, causal, scale);
}

std::tuple<at::Tensor, at::Tensor> attention_fwd_mma(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                     bool causal, double scale) {
  return attention_fwd_with(Kernel::kMma, q, k, v, causal, scale);
}

bool attention_fwd_uses_mma(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return q.is_cuda() && mma_applies(q, k, v, q);  // attention_fwd's o is a fresh (aligned) tensor
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_bwd_with(Kernel kernel, const at::Tensor& d_o,
                                                                  const at::Tensor& q, const at::Tensor& k,
                                                                  const at::Tensor& v, const at::Tensor& o,
                                                                  const at::Tensor& lse, bool causal, double scale) {
  check_like(q, q, 3, "q");
  for (const auto& [t, name] : {std::pair{&k, "k"}, std::pair{&v, "v"}}) check_like(*t, q, 3, name);
  check_like(o, q, 3, "o");
  check_like(d_o, q, 3, "d_o");
  TORCH_CHECK(o.sizes() == q.sizes() && d_o.sizes() == q.sizes() && v.sizes() == k.sizes(),
              "attention backward: d_o and o like q (bh, seq_q, d), v like k");
  TORCH_CHECK(lse.is_cuda() && lse.scalar_type() == at::kFloat && lse.is_contiguous() &&
                  lse.numel() == q.size(0) * q.size(1),
              "attention backward: lse must be the forward's contiguous fp32 (bh, seq_q) tensor");
  const c10::cuda::CUDAGuard guard(q.device());
  at::Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  at::Tensor delta = at::empty_like(lse);
  const bool mma = kernel == Kernel::kMma || (kernel == Kernel::kAuto && mma_bwd_applies(q, k, v, o, d_o));
  TORCH_CHECK(!mma || mma_bwd_applies(q, k, v, o, d_o), "attention_bwd_mma: the tensor-core kernels need fp16 or "
              "bf16 at head dim 64 or 128 on sm_80+ (16-byte aligned q, k, v, d_o); got ", q.scalar_type(),
              ", head dim ", q.size(2));
  const auto launcher = mma ? st_attention_bwd_mma : st_attention_bwd;
  check_launch(launcher(st_dtype(q), q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), d_o.data_ptr(),
                        lse.data_ptr<float>(), delta.data_ptr<float>(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                        q.size(0), q.size(1), k.size(1), q.size(2), static_cast<float>(scale), causal,
                        c10::cuda::getCurrentCUDAStream().stream()),
               mma ? "attention backward (tensor cores)" : "attention backward");
  return {dq, dk, dv};
}

using Grads = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

Grads attention_bwd(const at::Tensor& d_o, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const at::Tensor& o, const at::Tensor& lse, bool causal, double scale) {
  return attention_bwd_with(Kernel::kAuto, d_o, q, k, v, o, lse, causal, scale);
}

Grads attention_bwd_scalar(const at::Tensor& d_o, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& o, const at::Tensor& lse, bool causal, double scale) {
  return attention_bwd_with(Kernel::kScalar, d_o, q, k, v, o, lse, causal, scale);
}

Grads attention_bwd_mma(const at::Tensor& d_o, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const at::Tensor& o, const at::Tensor& lse, bool causal, double scale) {
  return attention_bwd_with(Kernel::kMma, d_o, q, k, v, o, lse, causal, scale);
}

void check_targets(const at::Tensor& logits, const at::Tensor& target) {
  check_like(logits, logits, 2, "logits");
  TORCH_CHECK(target.is_cuda() && target.device() == logits.device(), "target must be on ", logits.device());
  TORCH_CHECK(target.scalar_type() == at::kLong && target.dim() == 1 && target.is_contiguous() &&
                  target.size(0) == logits.size(0),
              "target must be a contiguous int64 (rows,) tensor");
}

std::tuple<at::Tensor, at::Tensor> cross_entropy_fwd(const at::Tensor& logits, const at::Tensor& target,
                                                     double smoothing, int64_t ignore_index) {
  check_targets(logits, target);
  const c10::cuda::CUDAGuard guard(logits.device());
  at::Tensor loss = at::empty({logits.size(0)}, logits.options().dtype(at::kFloat));
  at::Tensor lse = at::empty_like(loss);
  check_launch(st_cross_entropy_fwd(st_dtype(logits), logits.data_ptr(), target.data_ptr<int64_t>(),
                                    loss.data_ptr<float>(), lse.data_ptr<float>(), logits.size(0), logits.size(1),
                                    static_cast<float>(smoothing), ignore_index,
                                    c10::cuda::getCurrentCUDAStream().stream()),
               "cross-entropy forward");
  return {loss, lse};
}

at::Tensor cross_entropy_bwd(const at::Tensor& logits, const at::Tensor& target, const at::Tensor& lse,
                             const at::Tensor& dloss, double smoothing, int64_t ignore_index) {
  check_targets(logits, target);
  for (const at::Tensor* t : {&lse, &dloss})
    TORCH_CHECK(t->is_cuda() && t->scalar_type() == at::kFloat && t->dim() == 1 && t->is_contiguous() &&
                    t->size(0) == logits.size(0),
                "lse and dloss must be contiguous fp32 (rows,) CUDA tensors");
  const c10::cuda::CUDAGuard guard(logits.device());
  at::Tensor dlogits = at::empty_like(logits);
  check_launch(st_cross_entropy_bwd(st_dtype(logits), logits.data_ptr(), target.data_ptr<int64_t>(),
                                    lse.data_ptr<float>(), dloss.data_ptr<float>(), dlogits.data_ptr(),
                                    logits.size(0), logits.size(1), static_cast<float>(smoothing), ignore_index,
                                    c10::cuda::getCurrentCUDAStream().stream()),
               "cross-entropy backward");
  return dlogits;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("attention_fwd", &attention_fwd, "FlashAttention forward: (o, lse), on tensor cores where they apply");
  m.def("attention_fwd_scalar", &attention_fwd_scalar, "FlashAttention forward, attention.cu's scalar kernel");
  m.def("attention_fwd_mma", &attention_fwd_mma, "FlashAttention forward, attention_mma.cu (tensor cores)");
  m.def("attention_fwd_uses_mma", &attention_fwd_uses_mma, "whether attention_fwd runs attention_mma.cu");
  m.def("attention_bwd", &attention_bwd, "FlashAttention backward: (dq, dk, dv), on tensor cores where they apply");
  m.def("attention_bwd_scalar", &attention_bwd_scalar, "FlashAttention backward, attention.cu's scalar kernels");
  m.def("attention_bwd_mma", &attention_bwd_mma, "FlashAttention backward, attention_mma_bwd.cu (tensor cores)");
  m.def("cross_entropy_fwd", &cross_entropy_fwd, "fused cross-entropy forward: (loss per row, lse)");
  m.def("cross_entropy_bwd", &cross_entropy_bwd, "fused cross-entropy backward: dlogits");
}
