"""a5's verdicts per stage: equality to one process, the bytes held and sent against the ZeRO
paper's formulas at the padded Ψ', stage 2's early reduce-scatters and stage 3's gathers."""

from __future__ import annotations

from autograder import checks
from autograder.suites import paired, sized

from .inputs import KIND
from .reference import _Reference, _close, _layout_of, _numel, _views, _whole


def _verify_equal(job: dict, outs: list[dict], ref: _Reference) -> None:
    from scaletrain.zero.verify import RTOL

    rtol, label = RTOL[job["optimizer"]], job["name"] + ":"
    snapshots, state = ref.run(job)
    layout = ref.layout(job)
    for out in outs:
        _layout_of(job, out, layout, label)
    for step, expected in enumerate(snapshots):
        for rank, out in enumerate(outs):
            got = dict(out["steps"][step].get("params") or {})
            if job["stage"] == 3:  # the units' parameters are sharded: rebuilt from every rank's shards
                shards = [sized(o["steps"][step].get("shards"), len(layout["units"]),
                                f"{label} rank {r}: unit shards after step {step + 1}") for r, o in enumerate(outs)]
                for i, unit in enumerate(layout["units"]):
                    flat = _whole([row[i] for row in shards], unit, f"{label} shard of unit {i} after step {step + 1}")
                    got.update(_views(flat, unit))
            for name, want in expected.items():
                if name not in got:
                    raise AssertionError(f"{label} parameter {name} missing after step {step + 1} (rank {rank})")
                _close(got[name], want, rtol=rtol, what=f"{label} parameter {name} after step {step + 1} (rank {rank})")
            if job["stage"] == 3:
                break  # the shards of all ranks make one answer
    for i, unit in enumerate(layout["units"]):
        keys = set().union(*(state.get(n, {}) for n in unit["names"]))
        for key in sorted(keys):
            flat = _whole([o["state"][i].get(key) if i < len(o["state"]) else None for o in outs], unit,
                          f"{label} optimizer state {key} of unit {i}")
            for name, view in _views(flat, unit).items():
                _close(view, state[name][key], rtol=rtol, what=f"{label} optimizer state {key} of {name}")


def _expected_held(job: dict, layout: dict):
    """(bytes this rank should hold after a step, the formula's breakdown): the paper's formula at
    Ψ' plus the frozen parameters (whole on every rank) and Adam's 4-byte step counter per shard."""
    from scaletrain.memory import zero_memory_per_rank

    psi = sum(u["padded"] for u in layout["units"])
    formula = zero_memory_per_rank(psi, job["size"], job["stage"], precision="fp32", optimizer=KIND[job["optimizer"]])
    counters = 4 * len(layout["units"]) if job["optimizer"] == "adamw" else 0
    return formula.total + layout["frozen"] + counters, formula, psi


def _verify_held(job: dict, outs: list[dict], ref: _Reference) -> None:
    layout = ref.layout(job)
    want, formula, psi = _expected_held(job, layout)
    for rank, out in enumerate(outs):
        _layout_of(job, out, layout, job["name"] + ":")
        for step, record in enumerate(out["steps"]):
            held = record["held"]
            if held["total"] != want:
                roles = ", ".join(f"{k} {v}" for k, v in held.items() if k != "total")
                raise AssertionError(
                    f"{job['name']}, rank {rank}, after step {step + 1}: the process holds {held['total']} B "
                    f"({roles}), the formula at padded Ψ' = {psi} allows {want} B (params {formula.params}, "
                    f"grads {formula.grads}, optimizer {formula.optimizer}, frozen {layout['frozen']}, step "
                    f"counters {want - formula.total - layout['frozen']}); memory_report said "
                    f"{out['reports']['memory_report']}")


def _verify_sent(job: dict, outs: list[dict], ref: _Reference) -> None:
    layout = ref.layout(job)
    size, f = job["size"], 3 if job["stage"] == 3 else 2
    want = f * (size - 1) * sum(u["m"] for u in layout["units"]) * layout["itemsize"]
    psi = sum(u["padded"] for u in layout["units"])
    for rank, out in enumerate(outs):
        for step, record in enumerate(out["steps"]):
            sent = record["sent"]
            got = sent["forward"] + sent["backward"] + sent["step"]
            if got != want:
                raise AssertionError(
                    f"{job['name']}, rank {rank}, step {step + 1}: {got} B handed to isend (forward "
                    f"{sent['forward']}, backward {sent['backward']}, step {sent['step']}), expected "
                    f"{f}Ψ'(N-1)/N = {want} B (Ψ' = {psi}); comm_report said {out['reports']['comm_report']}")


def _verify_early(job: dict, outs: list[dict], ref: _Reference) -> None:
    """Stage 2's backward, sampled after each gradient's hook: every complete bucket has been
    reduce-scattered (its bytes sent) and its full gradients dropped; nothing else is held."""
    layout = ref.layout(job)
    units, size, item = layout["units"], job["size"], layout["itemsize"]
    assert len(units) >= 2, "suite bug: expected several buckets"
    _, formula, _ = _expected_held(job, layout)
    counters = 4 * len(units) if job["optimizer"] == "adamw" else 0
    numel = {n: _numel(s) for u in units for n, s in zip(u["names"], u["shapes"])}
    every = sum((size - 1) * u["m"] * item for u in units)
    for rank, out in enumerate(outs):
        for step, record in enumerate(out["steps"]):
            at = f"{job['name']}, rank {rank}, backward of step {step + 1}"
            base = formula.params + layout["frozen"] + (formula.optimizer + counters if step else 0)
            arrived: set[str] = set()
            samples = record["samples"]
            if not samples or samples[-1]["phase"] != "end":
                raise AssertionError(f"{at}: the backward was not sampled")
            sampled = sorted(sample["at"] for sample in samples[:-1])
            if sampled != sorted(numel):  # one sample after each parameter's gradient, or the evidence is partial
                raise AssertionError(f"{at}: the backward was sampled after {len(sampled)} gradients, expected one "
                                     f"after each of the {len(numel)} parameters' (keep every gradient hook)")
            for sample in samples[:-1]:
                arrived.add(sample["at"])
                done = [u for u in units if arrived.issuperset(u["names"])]
                must_send = sum((size - 1) * u["m"] * item for u in done)
                may_hold = sum(numel[n] * item for u in units if u not in done for n in u["names"] if n in arrived)
                if sample["sent"] < must_send:
                    raise AssertionError(
                        f"{at}: after the gradient of {sample['at']}, {len(done)} bucket(s) were complete but only "
                        f"{sample['sent']} B had been sent, expected {must_send}: reduce-scatter each bucket from "
                        "_grad_ready as soon as it is complete")
                if sample["grads"] > may_hold:
                    raise AssertionError(
                        f"{at}: after the gradient of {sample['at']}, {sample['grads']} B of full gradients held, "
                        f"at most {may_hold} B may be (those of incomplete buckets): set p.grad = None once a "
                        "bucket is reduce-scattered")
                allowed = base + sum(u["m"] * item for u in done) + may_hold
                if sample["total"] > allowed:
                    raise AssertionError(
                        f"{at}: after the gradient of {sample['at']}, the process holds {sample['total']} B, at most "
                        f"{allowed} B may be (parameters, optimizer state, the shards of complete buckets' "
                        "gradients, the full gradients of incomplete ones)")
            end = samples[-1]
            if end["sent"] != every:
                raise AssertionError(f"{at}: {end['sent']} B sent during backward, expected {every} (one "
                                     "reduce-scatter of every bucket)")
            if end["grads"]:
                raise AssertionError(f"{at}: {end['grads']} B of full gradients kept after backward; set "
                                     "p.grad = None once reduce-scattered")


def _verify_stage3(job: dict, outs: list[dict], ref: _Reference) -> None:
    """Stage 3's forward (GPT): at each unit module's pre-hook only the root unit and that module's
    unit are gathered, and nothing but them is held beyond the shards; after backward nothing is
    gathered; during backward at most the root and two other units."""
    layout = ref.layout(job)
    units, item = layout["units"], layout["itemsize"]
    want, _, _ = _expected_held(job, layout)
    root = sum(u["padded"] for u in units if u["module"] == "") * item
    own = {}
    for u in units:
        if u["module"]:
            own[u["module"]] = own.get(u["module"], 0) + u["padded"] * item
    two = sum(sorted(own.values())[-2:])
    for rank, out in enumerate(outs):
        for step, record in enumerate(out["steps"]):
            at = f"{job['name']}, rank {rank}, step {step + 1}"
            seen = {sample["at"] for sample in record["samples"] if sample["phase"] == "forward"}
            if not seen.issuperset(own) or not any(sample["phase"] == "end" for sample in record["samples"]):
                raise AssertionError(f"{at}: the forward of {sorted(set(own) - seen)} (or the backward) was not sampled")
            for sample in record["samples"]:
                if sample["phase"] == "forward":
                    expected = root + own.get(sample["at"], 0)
                    if sample["gathered"] != expected:
                        raise AssertionError(
                            f"{at}: {sample['gathered']} B of parameters gathered when {sample['at']} starts its "
                            f"forward, expected {expected} (the root unit + this module's): gather a unit just "
                            "before its module runs and free it right after")
                    if sample["total"] - sample["gathered"] > want:
                        raise AssertionError(
                            f"{at}: besides the gathered parameters the process holds {sample['total'] - sample['gathered']} "
                            f"B when {sample['at']} starts its forward, at most {want} B (shards, gradients, state)")
                elif sample["phase"] == "backward" and sample["gathered"] > root + two:
                    raise AssertionError(
                        f"{at}: {sample['gathered']} B of parameters gathered after the gradient of {sample['at']}, at "
                        f"most {root + two} B (the root and two units): free each unit once its gradients are "
                        "reduce-scattered")
                elif sample["phase"] == "end" and (sample["gathered"] or sample["grads"]):
                    raise AssertionError(
                        f"{at}: after backward {sample['gathered']} B of parameters still gathered and "
                        f"{sample['grads']} B of full gradients held: free every unit after its backward")


def _verify_unshard(job: dict, outs: list[dict], ref: _Reference) -> None:
    size = job["size"]
    for rank, rows in enumerate(outs):
        for row, data in paired(rows, job["buffers"], f"rank {rank}: unshard results, one per buffer"):
            m = data.numel() // size
            checks.assert_equal(row["view"], data, what=f"rank {rank}: unshard of a view, N={size}, m={m}")
            checks.assert_equal(row["separate"], data, what=f"rank {rank}: unshard of a separate shard, N={size}, m={m}")
            want = (size - 1) * m * data.element_size()
            if row["sent"] != [want, want]:
                raise AssertionError(f"rank {rank}: unshard (N={size}, m={m}) handed {row['sent']} B to isend per "
                                     f"call, expected {want} (N-1 messages of m elements, the ring)")
