"""The calibration notebooks in notebooks/ are executed, not just stored, and
their claims are checked: each notebook ends with a cell printing
``CLAIMS = {json}``; the test parses it and re-derives every claim from the
numbers in it (the notebook's own ``holds`` verdicts must agree).

The stored notebooks carry their outputs (figures visible when browsing the
repository); those are checked for the figure and the claims too."""
import json
import math
import os
import re

import pytest

from conftest import ROOT

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CHUNKS = 10


def claims_of(nb):
    """The dict printed by the notebook's last code cell as ``CLAIMS = {...}``."""
    last = [c for c in nb.cells if c.cell_type == "code"][-1]
    text = "".join(o.get("text", "") for o in last.get("outputs", []) if o.output_type == "stream")
    assert text.startswith("CLAIMS = "), "the last cell prints CLAIMS = {json}"
    return json.loads(text[len("CLAIMS = "):])


def check_ppl_table(c):
    m = c["rows"]
    derived = {
        "imatrix NF4 beats no-imatrix (KLD)": m["nf4_imatrix"]["kld"] < m["nf4_no_imatrix"]["kld"],
        "fp16 source beats double-quant (PPL, KLD)": (m["nf4_imatrix"]["ppl"] < m["double_quant"]["ppl"]
                                                      and m["nf4_imatrix"]["kld"] < m["double_quant"]["kld"]),
        "NF4 beats uniform int4 (PPL, KLD)": (m["nf4_imatrix"]["ppl"] < m["int4"]["ppl"]
                                              and m["nf4_imatrix"]["kld"] < m["int4"]["kld"]),
        "all-int8 w8a8 within 1% of F32 (PPL)": abs(m["int8"]["ppl"] / m["f32"]["ppl"] - 1) < 0.01,
    }
    assert m["f32"]["kld"] == 0 and all(r["ppl_err"] > 0 for r in m.values())
    return derived


def check_ffn_sweep(c):
    kl, ppl, spr_kl = c["kl"], c["ppl"], c["sprinkle_kl"]
    gap = kl["fused"] - kl["baseline"]
    derived = {
        "fused chain worse than the per-op baseline (PPL, KL)": kl["fused"] > kl["baseline"] and ppl["fused"] > ppl["baseline"],
        "sprinkle_auto recovers part of the gap (PPL, KL)": (kl["baseline"] < kl["sprinkle_auto"] < kl["fused"]
                                                           and ppl["baseline"] < ppl["sprinkle_auto"] < ppl["fused"]),
        "fp32 SiLU output closes >= 90% of the gap": kl["fp32_silu_out"] - kl["baseline"] < 0.1 * gap,
        "exact LUT input leaves >= 50% of the gap": kl["exact_lut_input"] - kl["baseline"] > 0.5 * gap,
        "each extra exact layer lowers KL; all exact == baseline": (
            all(a > b for a, b in zip(spr_kl, spr_kl[1:]))
            and math.isclose(c["sprinkle_ppl"][-1], ppl["baseline"], rel_tol=1e-9)),
        "sensitivity sprinkle within its budget (25% of the layers)": (
            len(c["sensitivity_layers"]) == len(c["gmax_layers"]) == max(1, c["n_layer"] // 4)),
        "sensitivity sprinkle >= gmax sprinkle at equal layer count (PPL, KL)": (
            kl["sprinkle_sensitivity"] <= kl["sprinkle_gmax"] and ppl["sprinkle_sensitivity"] <= ppl["sprinkle_gmax"]),
        "in every activation mode the chain costs KL and the sensitivity layers recover part of it": all(
            c["act_modes"][f"{a}/per-op"]["kl"] < c["act_modes"][f"{a}/sensitivity"]["kl"]
            < c["act_modes"][f"{a}/fused"]["kl"] for a in {k.split("/")[0] for k in c["act_modes"]}),
    }
    assert c["sprinkle_kl"][0] == kl["fused"] and c["sprinkle_auto_layers"]
    k = len(c["gmax_layers"])  # the gmax row is the sprinkle row with as many exact layers
    assert kl["sprinkle_gmax"] == c["sprinkle_kl"][k] and ppl["sprinkle_gmax"] == c["sprinkle_ppl"][k]
    return derived


CHECKS = {"ppl_table": check_ppl_table, "ffn_sweep": check_ffn_sweep}


def check(path, nb, chunks):
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "the notebook draws its plot"
    source = "".join(c.source for c in nb.cells if c.cell_type == "code")
    assert ".errorbar(" in source and "ppl_err" in source, "the plot draws the +/- error bars"
    c = claims_of(nb)
    assert c["chunks"] == chunks
    (s0, s1), (c0, c1) = c["scored_chars"], c["calibration_chars"]
    assert s1 <= c0 or c1 <= s0, "calibration text overlaps the scored text"
    derived = CHECKS[path.stem](c)
    assert c["holds"] == derived, "the notebook's verdicts disagree with its numbers"
    failed = [k for k, v in derived.items() if not v]
    assert not failed, f"claims that do not hold: {failed}"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_and_its_claims_hold(path, shared, monkeypatch):
    monkeypatch.setenv("ORKPY_SHARED", str(shared))
    monkeypatch.setenv("ORKPY_NOTEBOOK_CHUNKS", str(CHUNKS))
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    check(path, nb, CHUNKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_notebook_has_outputs(path):
    # saved executed (figures show on the hosting site), with a reasonable size
    assert path.stat().st_size < 400_000
    nb = nbformat.read(path, as_version=4)
    check(path, nb, claims_of(nb)["chunks"])
    assert claims_of(nb)["chunks"] >= 100


def _table_lines(nb):
    """The printed PPL table's rows: {(configuration, alloc): int8 share text ("" when blank)}."""
    out = {}
    for c in nb.cells:
        for o in c.get("outputs", []) if c.cell_type == "code" else []:
            for line in o.get("text", "").splitlines():
                if re.match(r"^(F32 \(reference\)|llama\.cpp|all-int8|ours|uniform|double)", line):
                    share = re.search(r"(\d+\.\d%)\s*$", line)
                    alloc = "Q4_0" if " Q4_0 " in line else "Q4_K_M" if " Q4_K_M " in line else "-"
                    out[(line[:42].strip(), alloc)] = share.group(1) if share else ""
    return out


def test_ppl_table_text_agrees_with_its_table():
    """The notebook's words about the allocations match its table: the float reference has no int8 share,
    both allocation files are mixed (neither all int8)."""
    path = ROOT / "notebooks" / "ppl_table.ipynb"
    nb = nbformat.read(path, as_version=4)
    rows = _table_lines(nb)
    assert rows[("F32 (reference)", "-")] == "" and rows[("llama.cpp Q8_0 (GGUF-native)", "-")] == ""
    for alloc in ("Q4_0", "Q4_K_M"):
        share = float(rows[("ours: fp16 + alloc + imatrix + NF4", alloc)].rstrip("%"))
        assert 0 < share < 100, (alloc, share)
    words = "".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "allocates everything to int8" not in words and "both files are genuinely mixed" in words


def test_the_documented_way_to_run_a_notebook_works():
    """docs/develop.md's command (`jupyter execute`, nbclient's) is installed with the test extras."""
    import subprocess
    import sys
    assert "cd notebooks && jupyter execute --inplace" in (ROOT / "docs" / "develop.md").read_text(encoding="utf-8")
    exe = os.path.join(os.path.dirname(sys.executable), "jupyter")
    p = subprocess.run([exe, "execute", "--help"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "execute" in (p.stdout + p.stderr).lower()


def test_there_is_a_notebook():
    assert {p.stem for p in NOTEBOOKS} == set(CHECKS)


def test_claims_check_can_fail():
    c = {"kl": {"baseline": 0.002, "fused": 0.02, "sprinkle_auto": 0.025, "fp32_silu_out": 0.002,
                "exact_lut_input": 0.02, "sprinkle_sensitivity": 0.012, "sprinkle_gmax": 0.01},
         "ppl": {"baseline": 6.6, "fused": 6.8, "sprinkle_auto": 6.7, "sprinkle_sensitivity": 6.65,
                 "sprinkle_gmax": 6.7},
         "sprinkle_kl": [0.02, 0.01, 0.002], "sprinkle_ppl": [6.8, 6.7, 6.6], "sprinkle_auto_layers": [1],
         "n_layer": 2, "sensitivity_layers": [0], "gmax_layers": [1],
         "act_modes": {"static/per-op": {"kl": 0.003}, "static/sensitivity": {"kl": 0.01}, "static/fused": {"kl": 0.02}}}
    assert not check_ffn_sweep(c)["sprinkle_auto recovers part of the gap (PPL, KL)"]
    c["kl"]["sprinkle_auto"] = 0.01
    assert not check_ffn_sweep(c)["sensitivity sprinkle >= gmax sprinkle at equal layer count (PPL, KL)"]
    c["kl"]["sprinkle_sensitivity"] = 0.008
    assert all(check_ffn_sweep(c).values())
    c["sensitivity_layers"] = [0, 1]
    assert not check_ffn_sweep(c)["sensitivity sprinkle within its budget (25% of the layers)"]
    c["act_modes"]["static/sensitivity"]["kl"] = 0.025
    assert not check_ffn_sweep(c)["in every activation mode the chain costs KL and the sensitivity layers recover part of it"]
