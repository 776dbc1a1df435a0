"""a5's reference, on the trusted side only: one process training the same model on the mean of
the ranks' micro-batch gradients (`scaletrain.zero.verify`'s protocol), the unit layout the
reference engine declares, and the ranks' outputs read against it."""

from __future__ import annotations

import functools

from autograder import checks

from .inputs import _jobs


class _Reference:
    """Expected values, computed here from the reference library and cached per model.

    `start(wanted, seed)` builds the jobs the checks in `wanted` need and computes their expected
    values in a thread, while the worker runs the student's code (importing torch and, with the
    first optimizer, torch._dynamo costs seconds best overlapped); `jobs()` waits for the jobs,
    `wait()` for everything."""

    def __init__(self):
        import threading

        self._runs: dict = {}
        self._layouts: dict = {}
        self._thread = None
        self._error: BaseException | None = None
        self._built = threading.Event()
        self.need: dict[str, list[dict]] = {}

    def start(self, wanted: set[str], seed: int) -> None:
        import threading

        def compute():
            try:
                import torch
                torch.set_num_threads(1)  # the ranks have the cores
                self.need = _jobs(wanted, seed)
                self._built.set()
                for job in self._unique():
                    if job["kind"] == "train":
                        self.run(job)
                        self.layout(job)
            except BaseException as exc:  # noqa: BLE001 - re-raised by wait(), in the group's thread
                self._error = exc
            finally:
                self._built.set()

        self._thread = threading.Thread(target=compute, name="a5-reference", daemon=True)
        self._thread.start()

    def _unique(self) -> list[dict]:
        jobs = list({j["name"]: j for js in self.need.values() for j in js}.values())
        return sorted(jobs, key=lambda j: (j["kind"] != "unshard", j.get("stage", 0)))

    def jobs(self) -> list[dict]:
        """Every job once, in the order the ranks run them (unshard, then stage by stage)."""
        self._built.wait()
        self._raise()
        return self._unique()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"suite bug: the reference failed: {self._error!r}") from self._error

    def run(self, job: dict):
        """One process, step by step: ([{name: param} after each step], {name: {key: state}})."""
        key = (job["key"], job["optimizer"], job["size"], job["seed"])
        if key not in self._runs:
            self._runs[key] = _reference_run(job)
        return self._runs[key]

    def layout(self, job: dict) -> dict:
        key = (job["key"], job["stage"] == 3, job["size"], job["seed"])
        if key not in self._layouts:
            self._layouts[key] = _layout(job)
        return self._layouts[key]


def _reference_run(job: dict):
    import torch
    from autograder.probes.a5_zero import build_model
    from scaletrain.zero.verify import OPTIMIZER_SETUPS, micro_batch_loss

    model, groups = build_model(job["model"], job["seed"])
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = OPTIMIZER_SETUPS[job["optimizer"]][0](groups if groups is not None else trainable, **job["options"])
    size, snapshots = job["size"], []
    for step in range(job["steps"]):
        total = [torch.zeros_like(p) for p in trainable]
        for r in range(size):  # per-rank gradients first, summed in rank order, then / N
            model.zero_grad()
            micro_batch_loss(model, seed=job["seed"], step=step, rank=r).backward()
            for t, p in zip(total, trainable):
                t.add_(p.grad)
        for t, p in zip(total, trainable):
            p.grad = t.div_(size)
        opt.step()
        snapshots.append({n: p.detach().clone() for n, p in model.named_parameters()})
    state = {n: {k: v.clone() for k, v in opt.state[p].items() if isinstance(v, torch.Tensor) and v.shape == p.shape}
             for n, p in model.named_parameters() if p in opt.state}
    return snapshots, state


def _layout(job: dict) -> dict:
    """The units the engine builds (reference layout): names, offsets, shapes, n, m = N·m / N, the
    module (stage 3), and the bytes of the frozen parameters."""
    from autograder.probes.a5_zero import build_model
    from scaletrain.zero.layout import bucket_units, default_unit_modules, module_units, resolve_param_groups

    model, groups = build_model(job["model"], job["seed"])
    frozen = sum(p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad)
    resolved = resolve_param_groups(model, groups)
    where = dict(dp_rank=0, dp_world_size=job["size"])
    if job["stage"] == 3:
        units = module_units(model, resolved, default_unit_modules(model), **where)
    else:
        units = bucket_units(resolved, bucket_cap_bytes=int(job["bucket_cap_mb"] * 2**20), **where)
    names = {id(m): n for n, m in model.named_modules()}
    return {"units": [{"names": list(u.names), "offsets": list(u.offsets), "shapes": [tuple(p.shape) for p in u.params],
                       "numel": u.numel, "m": u.shard_numel, "padded": u.padded_numel,
                       "module": names.get(id(u.module))} for u in units],
            "frozen": frozen, "itemsize": units[0].full.element_size()}


# zero.verify's atol: entries whose exact value is 0 and whose computed one is rounding noise
_close = functools.partial(checks.assert_tensor_close, atol=1e-7)


def _whole(per_rank: list, unit: dict, what: str):
    """A unit's (N·m,) buffer from every rank's m elements (or one rank's whole buffer)."""
    import torch
    if any(t is None for t in per_rank):
        raise AssertionError(f"{what}: a rank holds no such tensor (freed or missing)")
    if all(t.numel() == unit["m"] for t in per_rank):
        return torch.cat([t.reshape(-1) for t in per_rank])
    if per_rank[0].numel() == unit["padded"]:
        return per_rank[0].reshape(-1)
    raise AssertionError(f"{what}: ranks hold {[t.numel() for t in per_rank]} elements, expected a shard of "
                         f"{unit['m']} each (or the whole {unit['padded']})")


def _views(flat, unit: dict) -> dict:
    return {n: flat[off:off + _numel(shape)].view(shape)
            for n, off, shape in zip(unit["names"], unit["offsets"], unit["shapes"])}


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _outputs(job: dict, per_rank: list) -> list:
    """The job's outputs of every rank that ran it (ranks < N), each complete: an answer with a
    step or a row missing fails rather than passing on what is there."""
    if not isinstance(per_rank, list) or len(per_rank) < job["size"]:
        raise AssertionError(f"{job['name']}: expected answers of {job['size']} ranks, got {str(per_rank)[:80]}")
    outs = [per_rank[r][job["name"]]["ok"] for r in range(job["size"])]
    for rank, out in enumerate(outs):
        if job["kind"] == "unshard":
            if len(out) != len(job["buffers"]):
                raise AssertionError(f"{job['name']}, rank {rank}: {len(out)} results for {len(job['buffers'])} buffers")
        elif len(out["steps"]) != job["steps"] or (job["trace"] and any("held" not in r for r in out["steps"])):
            raise AssertionError(f"{job['name']}, rank {rank}: {len(out['steps'])} steps reported, {job['steps']} run")
    return outs


def _layout_of(job: dict, out: dict, layout: dict, label: str) -> None:
    declared = [u["names"] for u in out["layout"]]
    expected = [u["names"] for u in layout["units"]]
    if declared != expected:
        raise AssertionError(f"{label} the engine's units {declared[:3]}... are not the given layout "
                             f"{expected[:3]}... (keep ZeRO.__init__'s units)")
