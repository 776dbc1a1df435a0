"""Uneven pipeline stages in the search: Megatron-Core's first/last-stage maps
(`--decoder-first-pipeline-num-layers`, `--decoder-last-pipeline-num-layers`) beside the balanced
split, chosen by the time model. The head's weight against eq. (3) of Narayanan et al. 2021; the
maps against a brute-force enumeration; the choice against the closed form of the slowest stage."""

from dataclasses import replace

import pytest

from scaletrain.plan import CLUSTERS, Layout, predict, search
from scaletrain.plan.published_runs import GPT3_FAMILY, LLAMA_FAMILY
from scaletrain.plan.specs import ModelSpec
from scaletrain.plan.stages import balanced_stages, first_last_options, head_layers, stage_options

H100 = CLUSTERS["h100"]
# a Llama-style model whose vocabulary outweighs four of its layers: the heavy-head case
HEAVY = ModelSpec(layers=30, hidden=2048, heads=16, kv_heads=4, ffn_hidden=5632, gated_ffn=True,
                  tied_embeddings=False, biases=False, learned_positions=False, seq=4096, vocab=128256,
                  name="heavy head")


def _brute_force(layers: int, pp: int, shed: int) -> set:
    """Every (first, q, ..., q, last) summing to l, ends within shed below the middle q (p = 2:
    two stages within shed of each other), the even split left out."""
    if pp == 2:
        return {(f, last) for f in range(1, layers) for last in range(1, layers)
                if f + last == layers and 0 < abs(f - last) <= shed}
    return {(f, *[q] * (pp - 2), last) for q in range(1, layers + 1) for f in range(1, q + 1)
            for last in range(1, q + 1) if f + last + (pp - 2) * q == layers
            and min(f, last) >= q - shed and (f, last) != (q, q)}


@pytest.mark.parametrize("layers,pp,shed", [(30, 8, 3), (126, 16, 1), (70, 12, 2), (32, 2, 2), (80, 5, 4),
                                             (96, 16, 1), (7, 3, 5)])
def test_first_last_options_are_megatrons_maps_within_the_shed(layers, pp, shed):
    got = first_last_options(layers, pp, shed)
    assert len(got) == len(set(got)) and set(got) == _brute_force(layers, pp, shed)


def test_head_layers_is_eq3s_logit_term_over_a_layer():
    gpt3 = GPT3_FAMILY["GPT-3 175B"]  # 2·s·h·V over 24·s·h² + 4·s²·h = V / (12h + 2s)
    assert head_layers(gpt3) == pytest.approx(51200 / (12 * 12288 + 2 * 2048))
    llama = LLAMA_FAMILY["Llama-3-8B"]  # 2·s·h·V over 2·s·(2h² + 2h·h_kv + 3h·f) + 4·s²·h
    assert head_layers(llama) == pytest.approx(128256 / (2 * 4096 + 2 * 1024 + 3 * 14336 + 2 * 8192))


def test_a_heavy_head_gets_a_lighter_last_stage_that_beats_the_balanced_split():
    assert head_layers(HEAVY) > 4
    best = [p for p in search(HEAVY, H100, 64, 256, microbatches=(1,), uneven_stages=True) if p.layout.pp == 8][0]
    stages = best.layout.stages
    assert stages is not None and stages[-1] < min(stages[:-1])  # the last stage gives up layers
    balanced = predict(HEAVY, H100, replace(best.layout, stages=balanced_stages(30, 8)))
    assert best.iteration_s < balanced.iteration_s
    # full recomputation: a layer is 4 forwards, the head 3; the slowest stage is the last one in
    # both maps, so their compute is in the ratio of their end stages' work
    head = 3 / 4 * head_layers(HEAVY)
    assert best.time.compute_s / balanced.time.compute_s == pytest.approx((stages[-1] + head) / (3 + head))


def test_a_light_head_keeps_the_balanced_split():
    model = replace(LLAMA_FAMILY["Llama-3-70B"], layers=78)  # 80 'layers' with embedding and loss: 16 × 5
    balanced = balanced_stages(78, 16)
    assert 1 < head_layers(model) < 4 / 3 and len(stage_options(model, 16)) == 3  # the others shed 2 at an end
    best = [p for p in search(model, H100, 128, 16, microbatches=(1,), interleaves=(1,), uneven_stages=True)
            if (p.layout.tp, p.layout.pp) == (8, 16)][0]
    assert best.layout.stages == balanced  # a lighter last stage only ties (a middle stage is slowest) on more memory


def test_the_even_split_stays_where_the_head_is_light():
    model = LLAMA_FAMILY["Llama-3-70B"]  # under full recomputation the head is worth 0.8 of a layer
    lay = Layout(tp=8, pp=2, dp=1, microbatch=1, global_batch=8)
    options = stage_options(model, 2)
    assert options[0] is None and (41, 39) in options
    times = {s: predict(model, H100, replace(lay, stages=s)).iteration_s for s in options}
    assert min(times, key=times.get) is None
