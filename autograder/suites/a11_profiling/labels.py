"""The category of each op name the a11 suite grades, labelled by hand from the contract of
`categorise` (lib/scaletrain/profile/categories.py), not computed by its rules.  The names are those
real traces record: the tiny GPT's steps under torch.profiler on a CPU (AdamW foreach and looped,
SGD with momentum), the kernels a GPU step dispatches to (flash, efficient and cuDNN attention,
fused AdamW), and the events of c10d, NCCL and gloo collectives.  PUBLIC are the names of the public
tests (assignments/a11_profiling/tests/); the rest are hidden."""

M, A, N, ACT, E, O, C, X = ("matmul", "attention", "normalization", "activation", "elementwise", "optimizer",
                            "communication", "other")

PUBLIC = {"aten::addmm": M, "aten::mm": M, "aten::_scaled_dot_product_flash_attention_for_cpu": A,
          "aten::native_layer_norm": N, "aten::_softmax": N, "aten::gelu": ACT, "aten::add": E, "aten::mul_": E,
          "aten::embedding": X, "aten::view": X, "AddmmBackward0": M, "GeluBackward0": ACT,
          "autograd::engine::evaluate_function: NativeLayerNormBackward0": N, "aten::_foreach_mul_": O,
          "c10d::allreduce_": C, "nccl:all_reduce": C}

FORWARD = {
    # matmul
    "aten::linear": M, "aten::matmul": M, "aten::addmm": M, "aten::mm": M, "aten::bmm": M, "aten::baddbmm": M,
    "aten::addbmm": M, "aten::einsum": M,
    # attention: the public op and every kernel it dispatches to, forward and backward
    "aten::scaled_dot_product_attention": A, "aten::_scaled_dot_product_flash_attention_for_cpu": A,
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": A, "aten::_scaled_dot_product_flash_attention": A,
    "aten::_scaled_dot_product_flash_attention_backward": A, "aten::_scaled_dot_product_efficient_attention": A,
    "aten::_scaled_dot_product_efficient_attention_backward": A, "aten::_scaled_dot_product_cudnn_attention": A,
    "aten::_flash_attention_forward": A, "aten::_flash_attention_backward": A, "aten::_efficient_attention_forward": A,
    "aten::_efficient_attention_backward": A, "aten::_scaled_dot_product_attention_math": A,
    # normalization
    "aten::layer_norm": N, "aten::native_layer_norm": N, "aten::native_layer_norm_backward": N, "aten::rms_norm": N,
    "aten::group_norm": N, "aten::native_group_norm": N, "aten::batch_norm": N, "aten::native_batch_norm": N,
    "aten::softmax": N, "aten::_softmax": N, "aten::_softmax_backward_data": N, "aten::log_softmax": N,
    "aten::_log_softmax": N, "aten::_log_softmax_backward_data": N,
    # activation
    "aten::gelu": ACT, "aten::gelu_backward": ACT, "aten::relu": ACT, "aten::relu_": ACT,
    "aten::threshold_backward": ACT,
    "aten::silu": ACT, "aten::silu_backward": ACT, "aten::sigmoid": ACT, "aten::sigmoid_backward": ACT,
    "aten::tanh": ACT, "aten::tanh_backward": ACT, "aten::glu": ACT,
    # elementwise
    "aten::add": E, "aten::add_": E, "aten::sub": E, "aten::mul": E, "aten::mul_": E, "aten::div": E, "aten::div_": E,
    "aten::neg": E, "aten::exp": E, "aten::log": E, "aten::sqrt": E, "aten::rsqrt": E, "aten::pow": E,
    "aten::where": E, "aten::masked_fill": E, "aten::masked_fill_": E, "aten::clamp": E, "aten::lerp_": E,
    "aten::addcmul_": E, "aten::addcdiv_": E, "aten::dropout": E, "aten::native_dropout": E,
    "aten::native_dropout_backward": E, "aten::fill_": E, "aten::zero_": E, "aten::copy_": E,
    # other
    "aten::embedding": X, "aten::embedding_dense_backward": X, "aten::cross_entropy_loss": X, "aten::nll_loss": X,
    "aten::nll_loss_forward": X, "aten::nll_loss_backward": X, "aten::view": X, "aten::reshape": X,
    "aten::_unsafe_view": X, "aten::transpose": X, "aten::t": X, "aten::split": X, "aten::flatten": X, "aten::empty": X,
    "aten::zeros": X, "aten::zeros_like": X, "aten::ones_like": X, "aten::arange": X, "aten::clone": X, "aten::to": X,
    "aten::_to_copy": X, "aten::sum": X, "aten::mean": X, "aten::cat": X, "aten::index_select": X,
    "aten::_local_scalar_dense": X,
}

BACKWARD = {
    "AddmmBackward0": M, "MmBackward0": M, "BmmBackward0": M, "BaddbmmBackward0": M,
    "ScaledDotProductFlashAttentionForCpuBackward0": A, "ScaledDotProductEfficientAttentionBackward0": A,
    "ScaledDotProductFlashAttentionBackward0": A, "ScaledDotProductCudnnAttentionBackward0": A,
    "NativeLayerNormBackward0": N, "SoftmaxBackward0": N, "LogSoftmaxBackward0": N, "NativeGroupNormBackward0": N,
    "GeluBackward0": ACT, "ReluBackward0": ACT, "SiluBackward0": ACT, "TanhBackward0": ACT, "SigmoidBackward0": ACT,
    "AddBackward0": E, "SubBackward0": E, "MulBackward0": E, "DivBackward0": E, "NativeDropoutBackward0": E,
    "PowBackward0": E, "torch::autograd::AccumulateGrad": E,
    "EmbeddingBackward0": X, "NllLossBackward0": X, "ViewBackward0": X, "UnsafeViewBackward0": X,
    "TransposeBackward0": X, "TBackward0": X, "SplitBackward0": X,
}

SYSTEM = {
    "aten::_foreach_add_": O, "aten::_foreach_addcdiv_": O, "aten::_foreach_addcmul_": O, "aten::_foreach_div_": O,
    "aten::_foreach_lerp_": O, "aten::_foreach_mul_": O, "aten::_foreach_sqrt": O, "aten::_foreach_norm": O,
    "aten::_fused_adamw_": O, "aten::_fused_adam_": O, "aten::_fused_sgd_": O, "Optimizer.step#AdamW.step": O,
    "Optimizer.step#SGD.step": O, "Optimizer.zero_grad#AdamW.zero_grad": O,
    "c10d::allreduce_": C, "c10d::allgather_": C, "c10d::_allgather_base_": C, "c10d::reduce_scatter_": C,
    "c10d::_reduce_scatter_base_": C, "c10d::broadcast_": C, "c10d::alltoall_base_": C, "c10d::send": C,
    "c10d::recv_": C, "nccl:all_reduce": C, "nccl:all_gather": C, "nccl:_all_gather_base": C, "nccl:reduce_scatter": C,
    "nccl:broadcast": C, "nccl:send": C, "nccl:recv": C, "gloo:all_reduce": C, "gloo:all_gather": C,
    "gloo:broadcast": C,
}
