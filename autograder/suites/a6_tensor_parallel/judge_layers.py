"""a6's verdicts on the operators (6.1, 6.4's pair), the column and row layers, the attention with its
heads split and the MLP (6.2): one rank's outputs against the unsharded references, slices and bytes."""

from __future__ import annotations

from autograder import checks

from .names import (C_COL_BWD, C_COL_FWD, C_FG_BWD, C_FG_BYTES, C_FG_FWD, C_LAST, C_ROW_BWD, C_ROW_FWD, C_SP_PAIR_BWD,
                    C_SP_PAIR_FWD, RTOL)


def close(actual, expected, what: str) -> None:
    """The student's tensor against the reference, at the student's precision (`RTOL`)."""
    checks.assert_tensor_close(actual, expected, rtol=RTOL, what=what, compare_in="actual")


def sent(got, want: int, what: str, hint: str) -> None:
    """Bytes handed to isend against the formula."""
    if got != want:
        raise AssertionError(f"{what}: handed {got} B to isend, expected {want} B ({hint})")


def judge_operator(job, out, ref, r, check):
    import torch
    from scaletrain.tp.cost import allreduce_bytes, gather_bytes

    op, t, xs, ws = job["op"], job["t"], job["x"], job["w"]
    at = f"{op} (t={t}), rank {r}"
    cat_w = lambda dim: torch.cat(ws, dim=dim)  # noqa: E731
    n_x = xs[r].numel()
    if op == "f":
        want = (xs[r], sum(ws), 0, allreduce_bytes(n_x, t),
                "nothing forward, one allreduce of the input's size backward")
    elif op == "g":
        want = (sum(xs), ws[r], allreduce_bytes(n_x, t), 0, "one allreduce forward, nothing backward")
    elif op == "gather":
        k = xs[r].shape[-1]
        want = (torch.cat(xs, dim=-1), ws[r].narrow(-1, r * k, k), gather_bytes(n_x * t, t), 0,
                "an all-gather forward, nothing backward")
    elif op == "scatter":
        k = xs[r].shape[-1] // t
        want = (xs[r].narrow(-1, r * k, k), cat_w(-1), 0, gather_bytes(n_x, t),
                "nothing forward, an all-gather backward")
    elif op == "sp_gather":
        k = xs[r].shape[1]
        want = (torch.cat(xs, dim=1), sum(ws).narrow(1, r * k, k), gather_bytes(n_x * t, t), gather_bytes(n_x * t, t),
                "an all-gather forward, a reduce-scatter backward")
    else:  # sp_scatter
        k = xs[r].shape[1] // t
        want = (sum(xs).narrow(1, r * k, k), cat_w(1), gather_bytes(n_x, t), gather_bytes(n_x, t),
                "a reduce-scatter forward, an all-gather backward")
    y, grad, fwd, bwd, hint = want
    parts = OPERATOR_PARTS[check]
    if "y" in parts:
        close(out["y"], y, f"{at}: forward output")
    if "grad" in parts:
        if out.get("skipped"):
            raise AssertionError(f"{at}: {out['skipped']}")
        close(out["x_grad"], grad, f"{at}: input gradient")
    if "fwd" in parts:
        sent(out["sent_forward"], fwd, f"{at}, forward", hint)
    if "bwd" in parts:
        sent(out["sent_backward"], bwd, f"{at}, backward", hint)


# what each check judges of an operator's job: forward output, input gradient, bytes of each phase
OPERATOR_PARTS = {C_FG_FWD: ("y",), C_FG_BWD: ("grad",), C_FG_BYTES: ("fwd", "bwd"),
                  C_LAST: ("y", "grad", "fwd", "bwd"),
                  C_SP_PAIR_FWD: ("y", "fwd"), C_SP_PAIR_BWD: ("grad", "bwd")}


def layer_at(job, r) -> str:
    flag = "gather_output" if job["layer"] == "column" else "input_is_parallel"
    return f"{job['layer']}-parallel layer ({flag}={job['flag']}, t={job['t']}), rank {r}"


def judge_weights(job, out, r):
    """The slices of the unsharded weight and bias the layer took (judged before anything it computed)."""
    from scaletrain.tp.layers import shard

    t, parts, at = job["t"], job["parts"], layer_at(job, r)
    if job["layer"] == "column":
        where = dict(dim=0, rank=r, world_size=t, parts=parts)
        weight, bias = shard(job["weight"], **where), shard(job["bias"], **where)
        hint = "rows [r·out/t, (r+1)·out/t) of torch's (out, in) weight"
    else:
        weight, bias = shard(job["weight"], dim=1, rank=r, world_size=t), job["bias"]
        hint = "columns [r·in/t, (r+1)·in/t) of torch's (out, in) weight, the whole bias"
    for name, got, want in (("weight", out["weight"], weight), ("bias", out["bias"], bias)):
        shape = tuple(getattr(got, "shape", ()))
        if shape != tuple(want.shape):
            raise AssertionError(f"{at}: holds a {name} of shape {shape}, expected {tuple(want.shape)}: {hint}")
        close(got, want, f"{at}: {name} taken from the unsharded layer ({hint})")


def judge_layer(job, out, ref, r, check):
    """Forward (C_COL_FWD, C_ROW_FWD): the slices it took, its output, its forward bytes. Backward
    (C_COL_BWD, C_ROW_BWD): its input, weight and bias gradients, its backward bytes."""
    from scaletrain.tp.cost import allreduce_bytes, gather_bytes
    from scaletrain.tp.layers import shard

    t, flag, column = job["t"], job["flag"], job["layer"] == "column"
    at, rows = layer_at(job, r), dict(dim=0, rank=r, world_size=t)
    d_out, d_in = job["weight"].shape
    b_s = job["x_full"].numel() // d_in
    judge_weights(job, out, r)
    if check in (C_COL_FWD, C_ROW_FWD):
        close(out["y"], ref["y"] if (not column or flag) else shard(ref["y"], dim=2, rank=r, world_size=t),
               f"{at}: output")
        if column:
            sent(out["sent_forward"], gather_bytes(b_s * d_out, t) if flag else 0, f"{at}, forward",
                   "nothing, or one all-gather with gather_output")
        else:
            sent(out["sent_forward"], allreduce_bytes(b_s * d_out, t), f"{at}, forward",
                   "g: one allreduce of the partial sums")
        return
    if out.get("skipped"):
        raise AssertionError(f"{at}: {out['skipped']}")
    x_grad = ref["x_grad"]
    if not column and flag:
        x_grad = x_grad.narrow(-1, r * (d_in // t), d_in // t)
    close(out["x_grad"], x_grad, f"{at}: input gradient")
    w_grad = shard(ref["weight_grad"], **rows) if column else shard(ref["weight_grad"], dim=1, rank=r, world_size=t)
    close(out["weight_grad"], w_grad, f"{at}: weight gradient")
    close(out["bias_grad"], shard(ref["bias_grad"], **rows) if column else ref["bias_grad"], f"{at}: bias gradient")
    if column:
        sent(out["sent_backward"], allreduce_bytes(b_s * d_in, t), f"{at}, backward", "f: one allreduce of dL/dX")
    else:
        sent(out["sent_backward"], 0 if flag else gather_bytes(b_s * d_in, t), f"{at}, backward",
               "nothing, or one all-gather of the input's gradient when the layer sliced X itself")


def held_rows(job, local, r) -> list[int]:
    """The rows of the unsharded QKV weight that rank r's (3h/t, h) slice holds, checked to be whole
    heads, the same heads in Q, K and V, in block order (the property every correct split has)."""
    import torch
    full, t, heads = job["qkv_w"], job["t"], job["n_head"]
    h, at = full.shape[1], f"attention (a={heads} heads, t={t}), rank {r}"
    d, mine = h // heads, heads // t
    if not isinstance(local, torch.Tensor) or tuple(local.shape) != (3 * h // t, h):
        raise AssertionError(f"{at}: holds a QKV weight of shape {tuple(getattr(local, 'shape', ()))}, expected "
                             f"{(3 * h // t, h)}: a/t = {mine} heads of {d} rows in each of Q, K and V")
    rows = []
    for i, row in enumerate(local):
        hit = (full == row).all(dim=1).nonzero().flatten().tolist()
        if not hit:
            raise AssertionError(f"{at}: row {i} of its QKV weight is no row of the unsharded weight")
        rows.append(hit[0])
    blocks = [rows[k * h // t:(k + 1) * h // t] for k in range(3)]
    for k, name in enumerate("QKV"):
        if any(not k * h <= i < (k + 1) * h for i in blocks[k]):
            raise AssertionError(f"{at}: block {k} of its QKV weight (its {name}) holds rows outside the unsharded "
                                 f"{name} rows [{k * h}, {(k + 1) * h}); the output must be its share of Q, K, V "
                                 "in order")
    heads_of = [sorted({(i - k * h) // d for i in blocks[k]}) for k in range(3)]
    for k, name in enumerate("QKV"):
        want = [(i - k * h) for i in blocks[k]]
        whole = [x * d + j for x in heads_of[k] for j in range(d)]
        if len(heads_of[k]) != mine or want != whole:
            raise AssertionError(f"{at}: its {name} rows {want[:8]}{'...' if len(want) > 8 else ''} are not {mine} "
                                 f"whole heads of {d} rows each (heads {heads_of[k]}): a head split over ranks "
                                 "needs the others' rows to compute its attention")
    if not heads_of[0] == heads_of[1] == heads_of[2]:
        raise AssertionError(f"{at}: holds Q of heads {heads_of[0]}, K of {heads_of[1]}, V of {heads_of[2]}: "
                             "a head's attention needs its own Q, K and V")
    return rows


def judge_attention(job, out, ref, r, check):
    t, at = job["t"], f"attention (a={job['n_head']} heads, t={job['t']}), rank {r}"
    rows = held_rows(job, out["qkv_w"], r)
    close(out["y"], ref["y"], f"{at}: output (the row-parallel projection takes its heads' columns in rank order)")
    if out.get("skipped"):
        raise AssertionError(f"{at}: {out['skipped']}")
    close(out["x_grad"], ref["x_grad"], f"{at}: input gradient")
    close(out["qkv_w_grad"], ref["qkv_w_grad"][rows], f"{at}: gradient of its QKV rows")
    close(out["qkv_b_grad"], ref["qkv_b_grad"][rows], f"{at}: gradient of its QKV bias")
    k = ref["proj_w_grad"].shape[1] // t
    close(out["proj_w_grad"], ref["proj_w_grad"].narrow(1, r * k, k), f"{at}: gradient of its projection columns")


def judge_mlp(job, out, ref, r, check):
    from scaletrain.tp.cost import allreduce_bytes
    at, n = f"MLP (t={job['t']}), rank {r}", job["x"].numel()
    close(out["y"], ref["y"], f"{at}: output")
    if out.get("skipped"):
        raise AssertionError(f"{at}: {out['skipped']}")
    close(out["x_grad"], ref["x_grad"], f"{at}: input gradient")
    for phase in ("forward", "backward"):
        sent(out[f"sent_{phase}"], allreduce_bytes(n, job["t"]), f"{at}, {phase}",
               "one allreduce of b·s·h: the GeLU runs on each rank's columns, no communication between the layers")
