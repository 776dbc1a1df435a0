"""a12's verdicts: the student's cache, beam search, retrieve and re-rank and quantization (run in the
sandboxed worker by autograder/probes/a12_inference.py) against reference.py, computed here before
any student code runs. Every check grades what any correct design has: the full forward's logits,
exhaustive search's answer, torch.topk's values, an error bound read off the weights; the evidence of
the technique (bytes held, elements written, positions run, elements sorted) is measured by the probe
below the student's code and counts only beside right values (`Check.needs`)."""

from __future__ import annotations

from autograder import checks
from autograder.suites import answers, judge_calls, part

from . import inputs, reference
from .names import (C_BEAM, C_BEAM_COST, C_BEAM_PRUNED, C_BYTES, C_CACHE, C_REORDER, C_RR, C_RR_BEAMS, C_RR_COUNT,
                    C_STEP, PROBE)

CALL_S = 60  # one probe call: a few tiny models, a second or two
WRITE_SLACK = 3  # elements a cache may write per element it holds: amortized growth passes, a copy per step not


def close(got, want, what: str) -> None:
    """Scale-aware comparison in the student's dtype (fp64 to 1e-9, fp32 to 1e-4)."""
    import torch
    rtol = 1e-9 if getattr(got, "dtype", None) == torch.float64 else 1e-4
    checks.assert_tensor_close(got, want, rtol=rtol, what=what, compare_in="actual")


# ---------------------------------------------------------------- 12.1 the cache

def _judge_cache(asked, jobs, refs) -> None:
    for (got, job), (logits, _) in zip(answers(asked, jobs, "decode answers"), refs):
        where = f"decoding ({job['name']}) in chunks {job['cuts']}"
        close(got["logits"], logits, f"{where}: logits against the full forward")
        if got["length"] != job["cuts"][-1]:
            raise AssertionError(f"{where}: cache.length is {got['length']!r}, expected {job['cuts'][-1]}")


def _judge_reorder(asked, jobs, refs) -> None:
    for (got, job), (_, after) in zip(answers(asked, jobs, "decode answers"), refs):
        close(got["reordered"], after, f"reorder({job['parents'].tolist()}) after {job['ridx'].shape[1]} positions "
                                       f"({job['name']}): the next token's logits of each row's new past")


def _held(job) -> int:
    """2·L·b·s·h·bytes of a full cache of job's decoding."""
    import torch
    cfg, (b, s) = job["cfg"], job["idx"].shape
    element = torch.empty(0, dtype=getattr(torch, job["dtype"])).element_size()
    return 2 * cfg["n_layer"] * b * s * cfg["n_embd"] * element


def _judge_bytes(asked, jobs) -> None:
    for got, job in answers(asked, jobs, "decode answers"):
        want, where = _held(job), f"a full cache ({job['name']}, s={job['idx'].shape[1]}, {job['dtype']})"
        if got["held"] != want:
            raise AssertionError(f"{where} holds {got['held']} bytes (every storage reachable from it or made while "
                                 f"decoding and still alive), expected 2·L·b·s·h·bytes = {want}")
        if got["nbytes"] != want:
            raise AssertionError(f"{where}: nbytes reports {got['nbytes']!r}, it holds {want}")


def _judge_step(asked, jobs) -> None:
    for got, job in answers(asked, jobs, "decode answers"):
        held = 2 * job["cfg"]["n_layer"] * job["idx"].numel() * job["cfg"]["n_embd"]  # elements of a full cache
        if got["written"] > WRITE_SLACK * held:
            raise AssertionError(f"decoding ({job['name']}) in {len(job['cuts']) - 1} steps: your cache's code "
                                 f"produced {got['written']} elements for a cache of {held}: more than "
                                 f"{WRITE_SLACK}x, so a step copies the history (O(n²) over a decoding), not only its "
                                 "new positions")


# ---------------------------------------------------------------- 12.2 beam search

def _sequences(got, job, what: str):
    import torch
    seqs = got["seqs"]
    if not isinstance(seqs, torch.Tensor) or tuple(seqs.shape) != (job["k"], job["steps"]):
        raise AssertionError(f"{what}: sequences {getattr(seqs, 'shape', seqs)}, expected ({job['k']}, {job['steps']})")
    return seqs.long()


def _judge_beam(asked, jobs, refs) -> None:
    import torch
    for (got, job), (seqs, scores) in zip(answers(asked, jobs, "beam_search answers"), refs):
        where = f"beam_search({job['name']}, prompt {job['prompt'].tolist()})"
        mine = _sequences(got, job, where)
        if not torch.equal(mine, seqs):
            raise AssertionError(f"{where}: sequences {mine.tolist()}, expected {seqs.tolist()} (best first)"[:600])
        close(got["scores"], scores, f"{where}: scores (Σ log p of the new tokens)")
        close(got["scores"], reference.scored(job, mine), f"{where}: scores against the full forward of the sequences")


def _judge_cost(asked, jobs) -> None:
    for got, job in answers(asked, jobs, "beam_search answers"):
        bound = job["k"] * (job["prompt"].numel() + job["steps"] - 1)
        if got["positions"] > bound:
            raise AssertionError(f"beam_search({job['name']}) ran {got['positions']} positions through the model; "
                                 f"with the cache, k·(s0 + n - 1) = {bound}: the prompt once, then one token per beam")


def group_decode(ctx):
    """Tasks 12.1 and 12.2: cached decoding on the student's cache, reorder, bytes, writes; beam search."""
    import torch
    torch.set_num_threads(1)
    seed = checks.trial_seeds(1, salt=1212)[0]
    decode, (exact, pruned) = inputs.decode_jobs(seed), inputs.beam_jobs(seed)
    decode_refs = [reference.full_logits(j) for j in decode]
    exact_refs, pruned_refs = [reference.exhaustive(j) for j in exact], [reference.beam_uncached(j) for j in pruned]
    judge_calls(ctx, PROBE, {"decode": decode, "beam": exact + pruned}, {
        C_CACHE: lambda a: _judge_cache(a["decode"], decode, decode_refs),
        C_REORDER: lambda a: _judge_reorder(a["decode"], decode, decode_refs),
        C_BYTES: lambda a: _judge_bytes(a["decode"], decode),
        C_STEP: lambda a: _judge_step(a["decode"], decode),
        C_BEAM: lambda a: _judge_beam(part(a["beam"], 0, len(exact)), exact, exact_refs),
        C_BEAM_PRUNED: lambda a: _judge_beam(part(a["beam"], len(exact), None), pruned, pruned_refs),
        C_BEAM_COST: lambda a: _judge_cost(a["beam"], exact + pruned),
    }, CALL_S)


# ---------------------------------------------------------------- 12.3 retrieve and re-rank

def _exact(got, want, what: str) -> None:
    """Equal, -inf included: dtype, shape and every element."""
    import torch
    if not isinstance(got, torch.Tensor) or got.dtype != want.dtype or got.shape != want.shape:
        raise AssertionError(f"{what}: expected {want.dtype} {tuple(want.shape)}, got "
                             f"{getattr(got, 'dtype', type(got).__name__)} {tuple(getattr(got, 'shape', ()))}")
    if not torch.equal(got, want):
        raise AssertionError(f"{what}: {got.tolist()} != expected {want.tolist()}"[:600])


def _judge_topk(got, job, where: str) -> None:
    """torch.topk's values exactly; each index at its value, distinct within its row; x untouched."""
    import torch
    x, k = job["x"], job["k"]
    flat = job["fn"] == "beams"
    x2 = x.reshape(1, -1) if flat else x
    want = torch.topk(x2, k, dim=1).values.reshape(-1) if flat else torch.topk(x2, k, dim=1).values
    values, indices = got["values"], got["indices"]
    _exact(values, want, f"{where}: values (torch.topk's)")
    if not isinstance(indices, torch.Tensor) or indices.dtype != torch.long or indices.shape != want.shape:
        raise AssertionError(f"{where}: indices must be int64 of shape {tuple(want.shape)}, got "
                             f"{getattr(indices, 'dtype', indices)} {tuple(getattr(indices, 'shape', ()))}")
    rows = indices.reshape(x2.shape[0], -1)
    if rows.min() < 0 or rows.max() >= x2.shape[1]:
        raise AssertionError(f"{where}: indices {rows.tolist()} outside [0, {x2.shape[1]})"[:400])
    if not torch.equal(x2.gather(1, rows).reshape(want.shape), values):
        raise AssertionError(f"{where}: x at your indices {rows.tolist()} is not your values"[:400])
    if any(len(set(r)) != len(r) for r in rows.tolist()):
        raise AssertionError(f"{where}: an index repeats within a row: {rows.tolist()}"[:400])
    _exact(got["x_after"], x, f"{where}: the input afterwards (must not change)")


def _judge_rerank(asked, jobs) -> None:
    for got, job in answers(asked, jobs, "re-rank answers"):
        fn = "retrieve_rerank" if job["fn"] == "rows" else "beam_topk"
        _judge_topk(got, job, f"{fn}({job['name']}, k={job['k']}, groups={job['groups']})")


def _judge_count(asked, jobs) -> None:
    for got, job in answers(asked, jobs, "re-rank answers"):
        where = f"{'retrieve_rerank' if job['fn'] == 'rows' else 'beam_topk'}({job['name']})"
        _judge_topk(got, job, where)
        if got["sorted"] * 4 >= job["x"].numel():
            raise AssertionError(f"{where}: {got['sorted']} elements went into a sort or out of the grader's sight "
                                 f"(numpy, Python lists, another thread), of {job['x'].numel()} scores: re-rank the "
                                 "candidates above the rough threshold only, in torch")


def group_rerank(ctx):
    """Task 12.3: retrieve and re-rank on rows and across beams, and the elements it sorts."""
    import torch
    torch.set_num_threads(1)
    rows, beams, counted = inputs.rerank_jobs(checks.trial_seeds(1, salt=1213)[0])
    judge_calls(ctx, PROBE, {"rerank": rows + beams + counted}, {
        C_RR: lambda a: _judge_rerank(part(a["rerank"], 0, len(rows)), rows),
        C_RR_BEAMS: lambda a: _judge_rerank(part(a["rerank"], len(rows), len(rows) + len(beams)), beams),
        C_RR_COUNT: lambda a: _judge_count(part(a["rerank"], len(rows) + len(beams), None), counted),
    }, CALL_S)
