"""bench/act_modes.py end to end on stories260K (tiny settings): its llama.cpp rows come from the
live llama.cpp in the same run, its texts are disjoint halves of one file, and a rotation the
model cannot take is reported, not run; a second run reuses the float reference."""
import json
import pathlib

import pytest

from conftest import load_bench


@pytest.mark.slow
def test_act_modes_bench_on_stories260k(shared, tmp_path):
    act_modes = load_bench("act_modes")
    out = tmp_path / "{model}.json"
    act_modes.main(["--model", "stories260k", "--chunks", "1", "--calib-chunks", "1", "--ctx", "256",
                    "--weights", "int8", "--rotate", "none", "hadamard+online", "--prefix", "1",
                    "--work", str(tmp_path), "--json-out", str(out)])
    d = json.loads((tmp_path / "stories260k.json").read_text())
    rows = {(r["rotate"], r["weights"], r["act"]): r for r in d["rows"]}
    whole = (shared / "text/tinystories-val-B.txt").read_text(encoding="utf-8")
    a, b = (pathlib.Path(p).read_text(encoding="utf-8") for p in (d["text"], d["calib"]))
    assert a + b == whole and abs(len(a) - len(b)) < 0.01 * len(whole)
    ours, theirs = rows[("none", "f32", "float")], rows[("-", "F32", "llama.cpp")]
    assert theirs["ppl"] == pytest.approx(ours["ppl"], rel=2e-3)  # the same tokens, chunks and positions
    q8, q4 = rows[("-", "Q8_0", "llama.cpp")], rows[("-", "Q4_K_M+im", "llama.cpp")]
    assert 0 < q8["kld"] < q4["kld"] and q4["bytes"] < q8["bytes"] < ours["bytes"]
    assert 0 < rows[("none", "int8", "weight-only")]["kld"] < rows[("none", "int8", "per_tensor_p1")]["kld"]
    assert "n_ff = 172" in d["skipped"]["hadamard+online"]
    assert not any(r["rotate"] == "hadamard+online" for r in d["rows"])
    # a second run reuses the reference log-probs of the same tokens (not rewritten) and skips llama.cpp
    ref = next(tmp_path.glob("stories260k-*-ref-256-1.npz"))
    before = ref.stat().st_mtime_ns
    act_modes.main(["--model", "stories260k", "--chunks", "1", "--calib-chunks", "1", "--ctx", "256",
                    "--weights", "int8", "--rotate", "none", "--prefix", "1", "--no-llama",
                    "--work", str(tmp_path), "--json-out", str(out)])
    again = json.loads((tmp_path / "stories260k.json").read_text())["rows"]
    assert ref.stat().st_mtime_ns == before and again[0]["ppl"] == pytest.approx(ours["ppl"], rel=1e-12)
    assert not any(r["act"] == "llama.cpp" for r in again)
    assert again[1]["kld"] == pytest.approx(rows[("none", "int8", "weight-only")]["kld"], rel=1e-9)
