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


def test_dither_moves_a_dequantized_reference_off_its_grid(shared, tmp_path):
    """act_modes.dither_gguf: a 4-bit file's exact dequantization sits on its blocks' grids (few
    distinct values per block of 32); the dithered reference moves every quantized tensor within half a
    grid step of it and off the grid, keeps the float tensors, and is reproducible from its seed."""
    import numpy as np
    import oracle
    import orkpy
    from orkpy.formats.gguf import GGUFFile
    act_modes = load_bench("act_modes")
    q = oracle.llama_quantize(shared / "models/stories260K/stories260K-F32.gguf", tmp_path / "q.gguf", "Q4_1")
    f32 = tmp_path / "q.F32.gguf"
    orkpy.dequantize_gguf(q, f32)
    done = act_modes.dither_gguf(q, f32, tmp_path / "d1.gguf", 1)
    assert done.get("Q4_1", 0) >= 5  # the blocks' linears (stories260K's n_ff = 172 falls back to another type)
    act_modes.dither_gguf(q, f32, tmp_path / "d1b.gguf", 1)
    act_modes.dither_gguf(q, f32, tmp_path / "d2.gguf", 2)
    assert (tmp_path / "d1.gguf").read_bytes() == (tmp_path / "d1b.gguf").read_bytes()
    assert (tmp_path / "d1.gguf").read_bytes() != (tmp_path / "d2.gguf").read_bytes()
    with GGUFFile(q) as gq, GGUFFile(f32) as gf, GGUFFile(tmp_path / "d1.gguf") as gd:
        types = {t.name: t.type for t in gq.tensors}
        for t in gf.tensors:
            w, d = np.asarray(gf.tensor(t.name)), np.asarray(gd.tensor(t.name))
            if types[t.name] in ("F32", "F16"):
                assert np.array_equal(w, d), t.name
                continue
            if types[t.name] != "Q4_1":
                continue
            v, dv = w.reshape(-1, 32), d.reshape(-1, 32)
            uniq = np.array([np.unique(r).size for r in v])
            assert uniq.max() <= 16  # on the Q4_1 grid: at most 16 levels a block
            step = (v.max(1) - v.min(1)) / 15  # Q4_1's step (its levels span min .. min + 15 d)
            assert np.all(np.abs(dv - v) <= 0.5 * step[:, None] * (1 + 1e-5) + 1e-12), t.name
            assert np.mean([np.unique(r).size for r in dv]) > 31  # off the grid
