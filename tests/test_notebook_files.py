"""The notebooks as stored: without outputs (the README's promise; nbval runs them in `make test`)
and with a unique id on every cell (nbformat 4.5 requires one; a missing id is a warning today
and an error in future nbformat)."""

import json

import pytest

from autograder.manifest import REPO

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_without_outputs_with_unique_cell_ids(path):
    nb = json.loads(path.read_text())
    assert (nb["nbformat"], nb["nbformat_minor"]) >= (4, 5), "cell ids need nbformat 4.5"
    ids = [cell.get("id") for cell in nb["cells"]]
    assert None not in ids, f"cells without an id: {[i for i, x in enumerate(ids) if x is None]}"
    assert len(set(ids)) == len(ids), "two cells share an id"
    run = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code" and (c["outputs"] or c["execution_count"])]
    assert not run, f"cells stored with outputs: {run} (clear them before committing)"


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 12
