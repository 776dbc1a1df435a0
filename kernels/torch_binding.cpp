// torch binding of the launchers in launchers.h: checks shapes, dtypes and devices, allocates the
// outputs, passes the current CUDA stream.  Built on demand (GPU machines only) by
// scaletrain/ops/cuda_ext.py with torch.utils.cpp_extension.load, together with softmax.cu and
// layer_norm.cu; the shapes arrive already flattened to (rows, cols) by scaletrain.ops.
#include <torch/extension.h>

#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include <optional>
#include <tuple>
#include <vector>

#include "launchers.h"

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

void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.dim() == 2 && t.is_contiguous(), name, " must be a contiguous (rows, cols) tensor");
  TORCH_CHECK(t.size(0) < (int64_t{1} << 31), name, ": at most 2^31 - 1 rows");
}

void check_like(const at::Tensor& t, const at::Tensor& ref, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.device() == ref.device(), name, " must be on ", ref.device());
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), name, " must have dtype ", ref.scalar_type());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

void* ptr_or_null(const std::optional<at::Tensor>& t) { return t.has_value() ? t->data_ptr() : nullptr; }

void check_launch(int err, const char* what) {
  TORCH_CHECK(err == 0, what, " launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
}

at::Tensor softmax_fwd(const at::Tensor& x, const std::optional<at::Tensor>& mask, std::vector<int64_t> sizes,
                       std::vector<int64_t> strides, int64_t causal_len) {
  check_rows(x, "x");
  const c10::cuda::CUDAGuard guard(x.device());
  MaskArgs args{nullptr, 1, 1, 0, 0, 0, 0};
  if (mask.has_value()) {
    TORCH_CHECK(mask->is_cuda() && mask->device() == x.device(), "mask must be on ", x.device());
    TORCH_CHECK(mask->scalar_type() == x.scalar_type(), "mask must have dtype ", x.scalar_type());
    TORCH_CHECK(sizes.size() == 2 && strides.size() == 4, "mask view: sizes (size1, size2), strides (s0, s1, s2, col)");
    args = MaskArgs{mask->data_ptr(), sizes[0], sizes[1], strides[0], strides[1], strides[2], strides[3]};
  }
  at::Tensor y = at::empty_like(x);
  check_launch(st_softmax_fwd(st_dtype(x), x.data_ptr(), y.data_ptr(), x.size(0), x.size(1), args, causal_len,
                              c10::cuda::getCurrentCUDAStream().stream()),
               "softmax forward");
  return y;
}

at::Tensor softmax_bwd(const at::Tensor& y, const at::Tensor& dy) {
  check_rows(y, "y");
  check_like(dy, y, "dy");
  TORCH_CHECK(dy.sizes() == y.sizes(), "dy must have the shape of y");
  const c10::cuda::CUDAGuard guard(y.device());
  at::Tensor dx = at::empty_like(y);
  check_launch(st_softmax_bwd(st_dtype(y), y.data_ptr(), dy.data_ptr(), dx.data_ptr(), y.size(0), y.size(1),
                              c10::cuda::getCurrentCUDAStream().stream()),
               "softmax backward");
  return dx;
}

void check_affine(const std::optional<at::Tensor>& p, const at::Tensor& x, const char* name) {
  if (!p.has_value()) return;
  check_like(*p, x, name);
  TORCH_CHECK(p->numel() == x.size(1), name, " must have ", x.size(1), " elements");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_fwd(const at::Tensor& x,
                                                              const std::optional<at::Tensor>& weight,
                                                              const std::optional<at::Tensor>& bias, double eps) {
  check_rows(x, "x");
  check_affine(weight, x, "weight");
  check_affine(bias, x, "bias");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty_like(x);
  auto stats = x.options().dtype(at::kFloat);
  at::Tensor mean = at::empty({x.size(0)}, stats), rstd = at::empty({x.size(0)}, stats);
  check_launch(st_layer_norm_fwd(st_dtype(x), x.data_ptr(), ptr_or_null(weight), ptr_or_null(bias), y.data_ptr(),
                                 mean.data_ptr<float>(), rstd.data_ptr<float>(), x.size(0), x.size(1),
                                 static_cast<float>(eps), c10::cuda::getCurrentCUDAStream().stream()),
               "layer_norm forward");
  return {y, mean, rstd};
}

std::tuple<at::Tensor, std::optional<at::Tensor>, std::optional<at::Tensor>> layer_norm_bwd(
    const at::Tensor& dy, const at::Tensor& x, const std::optional<at::Tensor>& weight, const at::Tensor& mean,
    const at::Tensor& rstd, bool need_dweight, bool need_dbias) {
  check_rows(x, "x");
  check_like(dy, x, "dy");
  check_affine(weight, x, "weight");
  TORCH_CHECK(mean.scalar_type() == at::kFloat && rstd.scalar_type() == at::kFloat && mean.numel() == x.size(0) &&
                  rstd.numel() == x.size(0) && mean.is_contiguous() && rstd.is_contiguous(),
              "mean and rstd must be contiguous float32 tensors of ", x.size(0), " elements");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor dx = at::empty_like(x);
  std::optional<at::Tensor> dw, db;
  if (need_dweight) dw = at::empty({x.size(1)}, x.options());
  if (need_dbias) db = at::empty({x.size(1)}, x.options());
  at::Tensor workspace;
  if (need_dweight || need_dbias)
    workspace = at::empty({st_layer_norm_bwd_workspace(x.size(0), x.size(1))}, x.options().dtype(at::kFloat));
  check_launch(st_layer_norm_bwd(st_dtype(x), dy.data_ptr(), x.data_ptr(), ptr_or_null(weight), mean.data_ptr<float>(),
                                 rstd.data_ptr<float>(), dx.data_ptr(), ptr_or_null(dw), ptr_or_null(db),
                                 workspace.defined() ? workspace.data_ptr<float>() : nullptr, x.size(0), x.size(1),
                                 c10::cuda::getCurrentCUDAStream().stream()),
               "layer_norm backward");
  return {dx, dw, db};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "scaletrain fused softmax and LayerNorm CUDA kernels (kernels/softmax.cu, kernels/layer_norm.cu)";
  m.def("softmax_fwd", &softmax_fwd, "softmax forward over rows (x, mask, mask sizes, mask strides, causal_len)");
  m.def("softmax_bwd", &softmax_bwd, "softmax backward (y, dy) -> dx");
  m.def("layer_norm_fwd", &layer_norm_fwd, "LayerNorm forward (x, weight, bias, eps) -> (y, mean, rstd)");
  m.def("layer_norm_bwd", &layer_norm_bwd,
        "LayerNorm backward (dy, x, weight, mean, rstd, need_dweight, need_dbias) -> (dx, dweight, dbias)");
}
