"""The CUDA kernels (kernels/*.cu, unmodified) run on the CPU by the emulator (scaletrain.ops.toolchain.cuda_cpu).

Emulated, not real GPU runs: test_kernels_cuda.py's cases (every launcher bucket of
conformance.BUCKET_SHAPES with fewer rows, three dtypes, masks, causal mode, huge logits,
unaligned views) against float64 torch; the emulator's CUDA semantics on toy kernels
(kernels/cuda_cpu/selftest.cu); planted bugs that must fail naming the kernel (and the thread,
where the emulator stops the launch).  The builds are cached (~/.cache/scaletrain/cuda_cpu).
"""

import shutil
import time

import pytest
import torch

from autograder.suites.a1_kernels.planted import CUDA_BUGS
from scaletrain.ops import conformance as cf
from scaletrain.ops.toolchain import cuda_cpu
from scaletrain.ops.backends import KERNELS_DIR
from scaletrain.testing import assert_close

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to compile the kernels for the CPU")

# conformance.BUCKET_SHAPES with at most 5 rows (the first keeps 130: two row groups of dweight /
# dbias, and a partial last block of warp-per-row kernels)
SMALL_SHAPES = [(130 if i == 0 else min(rows, 5), cols) for i, (rows, cols) in enumerate(cf.BUCKET_SHAPES)]


@pytest.fixture(scope="module")
def emu():
    return cuda_cpu.make_backend()


# ---- the reference kernels, emulated ----------------------------------------------------------
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("shape", SMALL_SHAPES, ids=lambda s: f"emulated-{s[0]}x{s[1]}")
def test_emulated_kernels_match_torch(emu, dtype, shape):
    with cuda_cpu.naming_kernels():
        cf.softmax_forward(emu, shape, dtype=dtype)
        cf.softmax_backward(emu, shape, dtype=dtype)
        cf.layer_norm_forward(emu, shape, dtype=dtype, offset=1.0)
        cf.layer_norm_backward(emu, shape, dtype=dtype)


@pytest.mark.parametrize("shape, dtype, one_pass", [
    ((131, 97), "fp32", True),     # warp rows: 4 lanes a block, each lane several rows
    ((37, 1500), "fp32", True),    # a block a row (512 threads): one lane a block
    ((41, 300), "bf16", True),
    ((9, 5000), "bf16", False),    # 16-bit in the 512-thread bucket: x, dy and the sums would spill
    ((3, 8300), "fp32", False)])   # past the register buckets: the looped kernel
def test_dweight_dbias_in_one_pass_where_the_registers_hold_them(emu, shape, dtype, one_pass):
    """The rows kernel's persistent lanes (the emulator has 2 SMs: 4 blocks) sum dw and db
    themselves where one_pass_fits; elsewhere layer_norm_dwdb_partial's second pass does."""
    cf.layer_norm_backward(emu, shape, dtype=dtype, grads=("dx", "dweight", "dbias"))
    launched = " ".join(cuda_cpu.last_launches())
    assert ("layer_norm_dwdb_partial" in launched) != one_pass, launched
    assert "layer_norm_dwdb_final" in launched
    if one_pass:  # persistent: 2 blocks an SM, fewer than the rows would take one lane a row
        assert "_rows<" in launched and "<<<(4,1,1)" in launched, launched


@pytest.mark.parametrize("s", [37, 128, 1031], ids=lambda s: f"emulated-s{s}")
def test_emulated_masks_causal_and_huge_logits(emu, s):
    batch = (1, 2) if s < 1000 else (1, 1)  # the (s, s) scores of one head at s = 1031: 1M elements
    with cuda_cpu.naming_kernels():
        cf.softmax_forward(emu, (*batch, s, s), mask_shape=(batch[0], 1, 1, s), pad=True, causal=True)
        cf.softmax_forward(emu, (*batch, s, s), mask_shape=(s, s))
    cf.huge_logits(emu)
    cf.masked_prefix(emu, rows=2)
    cf.layer_norm_forward(emu, (50, 200), scale=1.0, offset=1000.0, tol=2e-4)


def test_emulated_autograd_path_and_unaligned_views(emu):
    cf.unaligned_views(emu, rows=9)


def test_a_37x131_softmax_forward_takes_well_under_two_seconds(emu):
    x = torch.randn(37, 131)
    emu.softmax_fwd(x, None, 0)  # the build and the first load are not the launch
    start = time.perf_counter()
    y = emu.softmax_fwd(x, None, 0)
    seconds = time.perf_counter() - start
    print(f"\n37x131 softmax forward through the emulator: {seconds * 1e3:.1f} ms; {cuda_cpu.last_launches()}")
    assert_close(y, torch.softmax(x.double(), -1), what="37x131 softmax")
    assert seconds < 2.0
    assert cuda_cpu.last_launches() == ["softmax_fwd_rows<float, 32, 2> <<<(10,1,1), (32,4,1), 0>>>"]


def test_half_and_bfloat16_conversions_round_like_torch():
    lib = cuda_cpu.load()
    every = torch.arange(65536, dtype=torch.int32).to(torch.int16)  # every 16-bit pattern
    torch.manual_seed(0)
    floats = torch.cat([torch.randn(20000) * 10.0 ** torch.randint(-9, 6, (20000,)).float(),
                        torch.tensor([65504.0, 65519.99, 65520.0, 1e9, -0.0, float("inf"), 2.0 ** -25, 2.0 ** -24,
                                      3 * 2.0 ** -26, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 1.0 + 2.0 ** -8]),
                        every.view(torch.bfloat16).float()[:32640]])  # bf16 values with half ties around them
    floats = torch.cat([floats, floats + floats * 2.0 ** -9, floats * (1 + 2.0 ** -12)])
    for kind, to16, dtype in ((0, 1, torch.float16), (2, 3, torch.bfloat16)):
        got_bits = torch.empty(floats.numel(), dtype=torch.int16)
        lib.dll.cuda_emu_convert(kind, floats.data_ptr(), got_bits.data_ptr(), floats.numel())
        want = floats.to(dtype)
        same = (got_bits.view(dtype) == want) | (torch.isnan(want) & torch.isnan(got_bits.view(dtype)))
        assert bool(same.all()), \
            f"{dtype}: {floats[~same][:5]} -> {got_bits.view(dtype)[~same][:5]}, torch {want[~same][:5]}"
        back = torch.empty(65536, dtype=torch.float32)
        lib.dll.cuda_emu_convert(to16, every.data_ptr(), back.data_ptr(), 65536)
        exact = every.view(dtype).float()
        assert torch.equal(back.isnan(), exact.isnan()) and torch.equal(back[~exact.isnan()], exact[~exact.isnan()])


# ---- the emulator's CUDA semantics on toy kernels -----------------------------------------------
@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    folder = tmp_path_factory.mktemp("toy")
    shutil.copy(KERNELS_DIR / "cuda_cpu" / "selftest.cu", folder / "softmax.cu")
    (folder / "layer_norm.cu").write_text("// the launchers all live in softmax.cu\n")
    backend = cuda_cpu.make_backend(folder)
    return lambda scenario, x: backend.softmax_fwd(x, None, scenario)


def test_warp_shuffles_and_votes_have_32_lane_semantics(toy):
    x = torch.arange(32, dtype=torch.float32) - 5.0  # lanes 6..31 hold positive values
    y = toy(0, torch.cat([x, torch.zeros(7 * 32)]).view(8, 32))
    lane = torch.arange(32)
    seg8 = lane % 8
    expected = torch.stack([
        x[lane ^ 5],
        torch.where(lane + 3 < 32, x[(lane + 3).clamp(max=31)], x),        # down: the top lanes keep their own
        torch.where(lane >= 3, x[(lane - 3).clamp(min=0)], x),             # up
        x[torch.full_like(lane, 7)],                                       # broadcast
        torch.where(seg8 + 3 < 8, x[(lane + 3).clamp(max=31)], x),         # down within 8-lane segments
        x[lane // 16 * 16 + 9],                                            # index within 16-lane segments
        torch.full((32,), float(sum(1 << k for k in range(6, 32)))),       # ballot of v > 0
        torch.full((32,), 3.0),                                            # any(lane == 3) + 2 * all(lane < 40)
    ])
    assert torch.equal(y, expected)


def test_barriers_order_shared_memory_and_a_missing_one_is_reported(toy):
    x = torch.randn(3, 64)
    assert_close(toy(1, x)[:, 0], x.double().sum(-1), rtol=1e-5, what="row sum through dynamic shared memory")
    # without __syncthreads, thread 0 runs to its end before thread 1 writes: every time
    with pytest.raises(cuda_cpu.KernelError, match=r"row_sum<false> <<<\(3,1,1\), \(64,1,1\)>>>: block \(0,0,0\), "
                       r"thread \(0,0,0\): reads 4 bytes of shared memory \(dynamic shared memory \+ 4\) that no "
                       r"thread of this block has written"):
        toy(2, x)
    assert toy(13, x)[0, 0] == 7.0 and toy(14, x)[0, 0] == 7.0  # ordered by __syncwarp, by __syncthreads
    with pytest.raises(cuda_cpu.KernelError, match=r"thread \(33,0,0\): reads shared memory \(handoff<0>\(float\*, "
                       r"int\)::cell \+ 0\) that thread \(0,0,0\) wrote with no __syncthreads in between: a race"):
        toy(11, x)
    with pytest.raises(cuda_cpu.KernelError, match=r"thread \(1,0,0\): .* wrote with no __syncwarp or warp "
                                                    r"collective in between"):
        toy(12, x)


@pytest.mark.parametrize("scenario, message", [
    (3, r"divergent_barrier <<<\(1,1,1\), \(32,1,1\)>>>: block \(0,0,0\), thread \(16,0,0\) has exited while "
        r"thread \(0,0,0\) waits at __syncthreads \(softmax.cu:\d+\)"),
    (4, r"shuffle_after_exit.*thread \(0,0,0\): __shfl_xor_sync \(softmax.cu:\d+\) with mask 0xffffffff, "
        r"but lane 31 \(thread \(31,0,0\)\) has exited"),
    (5, r"shuffle_outside_mask.*thread \(0,0,0\): __shfl_sync \(softmax.cu:\d+\) reads lane 20, which is not in "
        r"the mask 0x0000ffff"),
    (6, r"static_shared_overflow.*thread \(31,0,0\): an index out of the bounds of a fixed-size array"),
    (7, r"dynamic_shared_overflow.*thread \(31,0,0\): wrote byte 0 past the end of dynamic shared memory "
        r"\(128 bytes\)"),
    (9, r"write_input.*thread \(0,0,0\): wrote the read-only input x at byte 0"),
    (10, r"spin <<<\(1,1,1\), \(2048,1,1\)>>>.*invalid launch configuration \(2048 threads per block"),
])
def test_the_emulator_stops_bad_launches_naming_kernel_block_and_thread(toy, scenario, message):
    with pytest.raises(cuda_cpu.KernelError, match=message):
        toy(scenario, torch.zeros(1, 32))
    assert toy(1, torch.ones(2, 32))[:, 0].tolist() == [32.0, 32.0]  # the library still works


def test_an_endless_kernel_is_stopped_by_the_time_limit(toy, monkeypatch):
    monkeypatch.setenv("SCALETRAIN_CUDA_CPU_TIMEOUT", "0.5")
    with pytest.raises(cuda_cpu.KernelError, match=r"spin .*thread \(0,0,0\).*ran longer than 0.5 s"):
        toy(8, torch.zeros(1, 32))


# ---- planted bugs in the real kernels (the same ones a1's selftest plants) ----------------------------
def _planted(tmp_path, bug):
    name, old, new = CUDA_BUGS[bug]
    for src in cuda_cpu.SOURCES:
        text = (KERNELS_DIR / src).read_text()
        if src == name:
            assert text.count(old) == 1, f"plant {bug!r} no longer matches {src}"
            text = text.replace(old, new)
        (tmp_path / src).write_text(text)
    return cuda_cpu.make_backend(tmp_path)


@pytest.mark.parametrize("bug, kernel", [
    ("CUDA softmax that writes zeros", "softmax_fwd_rows<float, 32, 2>"),
    ("CUDA softmax sum reduced with wrong shuffle offsets (32 .. 2: lane ^ 32 is the lane itself, 1 is missing)",
     "softmax_fwd_rows<float, 32, 2>")], ids=["zeros", "wrong shuffle offset"])
def test_planted_wrong_numbers_fail_naming_the_kernel(tmp_path, bug, kernel):
    bad = _planted(tmp_path, bug)
    with pytest.raises(AssertionError, match=rf"kernels launched: .*{kernel.replace('<', '.').replace('>', '.')}"):
        with cuda_cpu.naming_kernels():
            cf.softmax_forward(bad, (37, 131))


def test_planted_missing_syncthreads_is_stopped_naming_kernel_thread_and_variable(tmp_path):
    bad = _planted(tmp_path, "CUDA dweight/dbias without the __syncthreads between shared-memory writes and reads")
    # rows longer than the register buckets: dw and db come from the second pass (the one-pass
    # rows kernel sums them itself for shorter rows)
    with pytest.raises(cuda_cpu.KernelError, match=r"layer_norm_dwdb_partial<float> <<<\(260,1,1\), \(32,8,1\)>>>: "
                       r"block \(0,0,0\), thread \(0,0,0\): reads 4 bytes of shared memory \(.*layer_norm_dwdb_partial"
                       r"<float>.*::sw \+ 132\) that no thread of this block has written"):
        cf.layer_norm_backward(bad, (3, 8300))


def test_planted_off_by_one_row_bound_is_stopped_naming_kernel_and_thread(tmp_path):
    bad = _planted(tmp_path, "CUDA softmax with an off-by-one row bound (reads past the end of x)")
    with pytest.raises(cuda_cpu.KernelError, match=r"softmax_fwd_rows<float, 32, 2> <<<\(10,1,1\), \(32,4,1\)>>>: "
                                                   r"block \(9,0,0\), thread \(0,1,0\): read byte 0 past the end of x"):
        cf.softmax_forward(bad, (37, 131))
