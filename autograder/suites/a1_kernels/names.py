"""a1's names: the submitted files, their sources, the probe, the forbidden names, the kernels each
task launches, and every check's name (no check name is written anywhere else)."""

SM, LN, SMC, LNC = "softmax_triton.py", "layer_norm_triton.py", "softmax.cu", "layer_norm.cu"
SOURCES = {SM: "kernels/softmax_triton.py", LN: "kernels/layer_norm_triton.py",
           SMC: "kernels/softmax.cu", LNC: "kernels/layer_norm.cu"}
PROBE = "autograder.probes.a1_kernels:"

FORBIDDEN_PY = ("torch.softmax", "torch.log_softmax", "torch.layer_norm", "torch.nn", "torch.special",
                "torch.ops", "torch._C", "torch.Tensor.softmax", "scaletrain.ops.naive", "scaletrain.ops.backends",
                "scaletrain.ops.functional", "scaletrain.ops.cuda_ext", "scaletrain.ops.benchmark",
                "scaletrain.ops.softmax", "scaletrain.ops.layer_norm", "scaletrain.ops.get_backend",
                "importlib", "__import__", "exec", "eval", "runpy")
FORBIDDEN_CU = ("torch", "ATen", "cudnn", "cub::", "<cub/")

# Triton, split by property: ragged / power-of-two shapes, long rows, masks / causal, each dtype,
# tiles other than the launcher's, forward / backward
C_SMOKE = "softmax forward on small irregular shapes"
C_HUGE = "softmax forward: huge logits stay finite (row max subtracted)"
C_SM_FWD = "softmax forward on hidden irregular and 3-D shapes"
C_SM_EVEN = "softmax forward on power-of-two shapes"
C_SM_LONG = "softmax forward on rows longer than one tile"
C_SM_MASK = "softmax forward with broadcast masks"
C_SM_CAUSAL = "softmax forward in causal mode"
C_PREFIX = "softmax forward on a long row whose first tile is fully masked"
C_SM_FP16 = "softmax forward with fp16 storage"
C_SM_BF16 = "softmax forward with bf16 storage"
C_SM_TILES = "softmax forward under tiles other than the launcher's (BLOCK_M, BLOCK_N, SINGLE_TILE)"
C_SM_BWD = "softmax backward on hidden shapes, long rows included"
C_SM_BWD_EVEN = "softmax backward on power-of-two shapes"
C_SM_BWD_FP16 = "softmax backward with fp16 storage"
C_SM_BWD_BF16 = "softmax backward with bf16 storage"
C_SM_BWD_TILES = "softmax backward under tiles other than the launcher's"
C_LN_FWD = "layer_norm forward on hidden shapes, long rows included"
C_LN_AFFINE = "layer_norm forward without weight, without bias, without both"
C_LN_SHIFT = "layer_norm forward when |mean| is 1000x the standard deviation"
C_LN_FP16 = "layer_norm forward with fp16 storage"
C_LN_BF16 = "layer_norm forward with bf16 storage"
C_LN_TILES = "layer_norm forward under tiles other than the launcher's"
C_LN_DX = "layer_norm backward dx on hidden shapes, long rows included"
C_LN_DX_NO_W = "layer_norm backward dx without weight"
C_LN_DX_FP16 = "layer_norm backward dx with fp16 storage"
C_LN_DX_BF16 = "layer_norm backward dx with bf16 storage"
C_LN_DX_TILES = "layer_norm backward dx under tiles other than the launcher's"
C_LN_PARTIALS = "layer_norm backward dweight and dbias from the dx kernel's per-program partial sums"
C_DWDB = "layer_norm backward dweight and dbias from the second kernel alone (any row length)"

# a kernel's compile check is granted only with its correctness in the same run: an empty kernel compiles
COMPUTES = {"1.1": (C_SMOKE, C_SM_FWD), "1.2": (C_SM_BWD,), "1.3": (C_LN_FWD,), "1.4": (C_LN_DX,), "1.5": (C_DWDB,)}
TRITON_KERNELS = {"1.1": ("softmax_triton", "softmax_fwd_kernel"), "1.2": ("softmax_triton", "softmax_bwd_kernel"),
                  "1.3": ("layer_norm_triton", "layer_norm_fwd_kernel"),
                  "1.4": ("layer_norm_triton", "layer_norm_bwd_dx_kernel"),
                  "1.5": ("layer_norm_triton", "layer_norm_bwd_dwdb_kernel")}
CUDA_KERNELS = {"1.6": (SMC, "forward", ("softmax_fwd",)), "1.7": (SMC, "backward", ("softmax_bwd",)),
                "1.8": (LNC, "forward", ("layer_norm_fwd",)), "1.9": (LNC, "backward", ("layer_norm_bwd",))}
EMULATED = {"1.6": "CUDA softmax forward matches torch (CPU emulation): every bucket, masks, causal, 3 dtypes",
            "1.7": "CUDA softmax backward matches torch (CPU emulation): every bucket, 3 dtypes",
            "1.8": "CUDA layer_norm forward matches torch (CPU emulation): every bucket, 3 dtypes",
            "1.9": "CUDA layer_norm backward matches torch (CPU emulation): dx, dweight, dbias"}

# GPU only
SPEED_CHECKS = {("softmax", "fwd"): "softmax forward", ("softmax", "bwd"): "softmax backward",
                ("layer_norm", "fwd"): "layer_norm forward", ("layer_norm", "bwd"): "layer_norm backward"}
GPU_CUDA = {"1.6": "CUDA softmax forward matches torch (all buckets, masks, causal, 3 dtypes)",
            "1.7": "CUDA softmax backward matches torch",
            "1.8": "CUDA layer_norm forward matches torch",
            "1.9": "CUDA layer_norm backward matches torch (dx, dweight, dbias)"}


def triton_compile_check(task: str) -> str:
    return f"{TRITON_KERNELS[task][1]} compiles for sm_80 (Triton compiler)"


def cuda_compile_check(task: str) -> str:
    cu, what, _ = CUDA_KERNELS[task]
    return f"{cu} {what} kernels compile for sm_80 (nvcc): no register spills, every kernel stores"


def speed_check(label: str, what: str) -> str:
    """label: "Triton" or "CUDA"; what: a value of SPEED_CHECKS."""
    return f"{label} {what} speed: >= 2x naive, >= 0.9x native"
