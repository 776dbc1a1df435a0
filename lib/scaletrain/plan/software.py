"""Software generations: what a training stack of a given year could do, as the planner's input.

The same model on the same GPUs ran markedly faster a year or two later without new hardware.
What changed is explicit here, each a mechanism the memory and time models already count
(`Layout`'s switches), never a fudge factor on the efficiency:

  megatron-2021  Narayanan et al. 2021 (§5): full activation recomputation, no sequence
                 parallelism, unfused attention (the s² scores stored), the gradient allreduce
                 after the backward, pipeline sends that block the rank, uniform stages.
  megatron-2022  Korthikanti et al. 2022 (§4.2.2, §5): sequence parallelism and selective
                 recomputation join full recomputation; otherwise as 2021.
  megatron-2024  Megatron-Core as Llama 3 and the NeMo recipes used it (Dubey et al. 2024,
                 §3.3.2): flash attention (Dao et al. 2022), the gradient reduction overlapped
                 with the backward and the pipeline's sends with compute, the distributed optimizer
                 (ZeRO-1), uneven first and last stages, context parallelism.

`SOFTWARE[name].space()` is the search space `scaletrain.plan.layouts.candidate_layouts` takes
for that generation; `search(..., **SOFTWARE["megatron-2024"].space(cps=(1, 2, 4)))` plans a
run with today's stack.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Software", "SOFTWARE"]


@dataclass(frozen=True, kw_only=True)
class Software:
    name: str
    year: int
    recompute: tuple[str, ...]
    sequence_parallel: tuple[bool, ...]
    flash_attention: bool
    overlap_dp: bool
    overlap_pp: bool
    zero: tuple[int, ...]
    uneven_stages: bool
    context_parallel: bool

    def space(self, *, cps: tuple[int, ...] = (1,)) -> dict:
        """candidate_layouts' keyword arguments for this generation (cps only if it has CP)."""
        if any(c > 1 for c in cps) and not self.context_parallel:
            raise ValueError(f"{self.name} has no context parallelism; use megatron-2024 or cps=(1,)")
        return dict(recompute=self.recompute, sequence_parallel=self.sequence_parallel, zero=self.zero,
                    overlap_dp=self.overlap_dp, flash_attention=self.flash_attention, overlap_pp=self.overlap_pp,
                    uneven_stages=self.uneven_stages, cps=tuple(cps))


SOFTWARE = {s.name: s for s in (
    Software(name="megatron-2021", year=2021, recompute=("full",), sequence_parallel=(False,),
             flash_attention=False, overlap_dp=False, overlap_pp=False, zero=(0,), uneven_stages=False,
             context_parallel=False),
    Software(name="megatron-2022", year=2022, recompute=("selective", "full"), sequence_parallel=(True, False),
             flash_attention=False, overlap_dp=False, overlap_pp=False, zero=(0,), uneven_stages=False,
             context_parallel=False),
    Software(name="megatron-2024", year=2024, recompute=("none", "selective", "full"), sequence_parallel=(True,),
             flash_attention=True, overlap_dp=True, overlap_pp=True, zero=(1,), uneven_stages=True,
             context_parallel=True),
)}
