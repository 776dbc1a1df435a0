"""a6's verdicts on the 3D grid (6.5): the student's coordinates and groups by their properties (any
correct layout passes), and the process groups its build made on the ranks."""

from __future__ import annotations

from .names import AXES


def grid_at(layout) -> str:
    dp, pp, tp = layout
    return f"3D grid dp={dp}, pp={pp}, tp={tp} ({dp * pp * tp} ranks)"


def judge_grid(layout, got) -> None:
    """`got` (the probe's `grid` for `layout`): coords and rank_of inverse and in range; per axis, the
    groups partition the ranks into groups of the degree, sharing the other coordinates, in the order of
    their coordinate on the axis (a rank's position in its group is its coordinate)."""
    at, degrees, n = grid_at(layout), dict(zip(AXES, layout)), layout[0] * layout[1] * layout[2]
    coords = [tuple(c) for c in got["coords"]]
    for r, c in enumerate(coords):
        if any(not 0 <= v < d for v, d in zip(c, layout)):
            raise AssertionError(f"{at}: coords({r}) = (dp, pp, tp) {c}, outside the degrees {layout}")
        if got["rank_of"][r] != r:
            raise AssertionError(f"{at}: rank_of{c} = {got['rank_of'][r]}, but coords({r}) = {c}: not inverse")
    for k, axis in enumerate(AXES):
        groups = got["groups"][axis]
        if sorted(r for g in groups for r in g) != list(range(n)):
            raise AssertionError(f"{at}: the {axis} groups {groups[:6]} do not hold every rank exactly once")
        for g in groups:
            if len(g) != degrees[axis]:
                raise AssertionError(f"{at}: the {axis} group {g} has {len(g)} ranks, {axis} = {degrees[axis]}")
            if [coords[r][k] for r in g] != list(range(degrees[axis])):
                raise AssertionError(f"{at}: in the {axis} group {g} the ranks' {axis} coordinates are "
                                     f"{[coords[r][k] for r in g]}, not 0..{degrees[axis] - 1} in order")
            if len({tuple(v for i, v in enumerate(coords[r]) if i != k) for r in g}) != 1:
                raise AssertionError(f"{at}: the {axis} group {g} holds ranks that differ on another axis "
                                     f"(coords {[coords[r] for r in g]})")


def judge_nodes(layout, got) -> None:
    """Each tp group is tp consecutive ranks starting at a multiple of tp: inside one node whenever tp
    divides the GPUs per node (ranks numbered node by node)."""
    tp = layout[2]
    for g in got["groups"]["tp"]:
        if g != list(range(g[0], g[0] + tp)) or g[0] % tp:
            raise AssertionError(f"{grid_at(layout)}: the tp group {g} is not {tp} consecutive ranks from a multiple "
                                 f"of {tp}: on nodes of 8 GPUs its allreduces (one per layer, forward and backward) "
                                 "would cross the slower links between nodes")


def judge_mesh(job, out, ref, r, check):
    """One rank's Mesh after the student's build, against the student's own coords and groups for the
    layout (whatever their layout; `rank_of` is the grid check's) and what a sum over each group reached."""
    layout, got = tuple(job["layout"]), ref.get("grid")
    at = f"{grid_at(layout)}, build on rank {r}"
    if got is None:
        raise AssertionError(f"{at}: the grid's coords and groups did not come back")
    if "error" in got:
        raise AssertionError(f"{at}: the grid raised {got['error'][0]}: {got['error'][1]}")
    if tuple(out["coords"]) != tuple(got["coords"][r]):
        raise AssertionError(f"{at}: Mesh.coords {tuple(out['coords'])}, but coords({r}) = {tuple(got['coords'][r])}")
    for k, axis in enumerate(AXES):
        mine = next((g for g in got["groups"][axis] if r in g), None)
        if mine is None:
            raise AssertionError(f"{at}: groups('{axis}') puts rank {r} in no group")
        if out["ranks"][axis] != mine:
            raise AssertionError(f"{at}: mesh.{axis}_ranks {out['ranks'][axis]}, but groups('{axis}') puts rank {r} "
                                 f"in {mine}")
        if out["position"][axis] != got["coords"][r][k]:
            raise AssertionError(f"{at}: position {out['position'][axis]} in mesh.{axis}_group, but its {axis} "
                                 f"coordinate is {got['coords'][r][k]}")
        if out["reached"][axis] != mine:
            raise AssertionError(f"{at}: a sum over mesh.{axis}_group reached ranks {out['reached'][axis]}, expected "
                                 f"{mine}: the group object is not the group of those ranks")
