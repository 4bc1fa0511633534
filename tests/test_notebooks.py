"""The calibration notebooks in notebooks/ are executed, not just stored."""
import os

import pytest

from conftest import ROOT

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, shared, monkeypatch):
    monkeypatch.setenv("ORKPY_SHARED", str(shared))
    monkeypatch.setenv("ORKPY_NOTEBOOK_CHUNKS", "10")
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "the notebook draws its plot"
    texts = "".join(o.get("text", "") for o in outputs)
    assert {"ppl_table": "ours: fp16 + alloc + imatrix + NF4", "ffn_sweep": "sprinkle_auto"}[path.stem] in texts


def test_there_is_a_notebook():
    assert NOTEBOOKS
