"""`orkpy gate` gates (issue 12): thresholds with a verdict and exit status,
calibration never on the scored tokens, no temporary files left behind, a
reproducible synthetic model, one definition of the int8 share, row names and
log lines that say what ran."""
import hashlib
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import orkpy
from orkpy.evaluation import gate
from orkpy.cli import main, read_text_like_llama_cpp
from orkpy.evaluation.gate import GateRow, holdout_split, verdict
from orkpy.evaluation.ppl import PPLResult, tokens_for_ppl
from orkpy.evaluation.synthetic import make_synthetic
from orkpy.formats.tiermap import TierEntry, TierMap

FAST = ["--chunks", "2", "--calib-chunks", "2", "--no-progress"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rows(out):
    return [line for line in out.splitlines() if line.startswith(("source (float)", "ours"))]


def _last(out):
    return out.strip().splitlines()[-1]


# ------------------------------------------------------------ thresholds --

def test_gate_without_thresholds_reports_only(capsys):
    assert main(["gate"] + FAST) == 0
    assert _last(capsys.readouterr().out) == "GATE: no thresholds given (report only)"


def test_gate_thresholds_pass_and_fail(capsys):
    assert main(["gate", "--max-kld", "10", "--max-dppl", "1000", "--max-dppl-rel", "1"] + FAST) == 0
    line = _last(capsys.readouterr().out)
    assert line.startswith("GATE PASS (ours: alloc + imatrix + nf4): dPPL ") and "mean KLD" in line
    assert main(["gate", "--max-kld", "0.000001", "--max-dppl", "1000"] + FAST) == 1
    line = _last(capsys.readouterr().out)
    assert line.startswith("GATE FAIL (ours: alloc + imatrix + nf4): mean KLD ") and line.endswith("> 1e-06")
    assert "dPPL" not in line                                    # only what failed is named


@pytest.mark.parametrize("bad", ["-1", "nan", "inf", "x"])
def test_threshold_usage_errors(bad, capsys):
    with pytest.raises(SystemExit) as e:
        main(["gate", "--max-kld", bad])
    assert e.value.code == 2


def _result(ppl, kld=None):
    return PPLResult(ppl=ppl, ppl_err=0.1, nll_mean=0.0, n_tokens=0, chunks=1, n_ctx=8, scored=3, wall_time=0.0,
                     kld=None if kld is None else {"mean": kld, "delta_ppl": 0.0, "same_top": 1.0})


def test_verdict_rules():
    rows = [GateRow("source (float)", _result(10.0), None), GateRow("main", _result(10.5, 0.02), 0.3)]
    assert verdict(rows) == (None, "GATE: no thresholds given (report only)")
    ok, line = verdict(rows, max_dppl=0.5, max_dppl_rel=0.05, max_kld=0.02)    # limits are inclusive
    assert ok and line == "GATE PASS (main): dPPL +0.5000 <= 0.5, dPPL/PPL +5.00% <= 5%, mean KLD 0.020000 <= 0.02"
    ok, line = verdict(rows, max_dppl=0.4, max_dppl_rel=0.04, max_kld=0.1)
    assert ok is False and line == "GATE FAIL (main): dPPL +0.5000 > 0.4, dPPL/PPL +5.00% > 4%"


# ------------------------------------------------------------ calibration --

@pytest.mark.parametrize("n,cc,chunks", [(1000, None, None), (1000, 3, None), (1000, 2, 4), (1030, None, 5),
                                         (5000, 1, 2)])
def test_holdout_split_is_disjoint(n, cc, chunks):
    n_ctx = 100
    calib_start, sc, cc2 = holdout_split(n, n_ctx, chunks, cc)
    assert cc2 == (cc if cc is not None else max(1, (n // n_ctx) // 10))
    assert n - calib_start == cc2 * n_ctx                       # the last cc2 whole chunks calibrate
    assert sc * n_ctx <= calib_start                            # every scored token comes before them
    assert sc == (chunks if chunks is not None else calib_start // n_ctx)


def test_holdout_split_refuses_what_does_not_fit():
    with pytest.raises(ValueError, match="lower --chunks"):
        holdout_split(1000, 100, 9, 2)
    with pytest.raises(ValueError, match="fewer than the 2"):
        holdout_split(300, 100, None, 2)


def test_texts_that_do_not_fit_name_the_file(tmp_path, capsys):
    paths = make_synthetic(tmp_path / "m")
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("The cat ran.\n")
    files = [paths["model"], paths["alloc"], paths["text"]]
    assert main(["gate"] + files + ["--calib", str(tiny)] + FAST) == 1
    assert f"{tiny}: " in capsys.readouterr().err
    assert main(["gate"] + files + ["--chunks", "200", "--calib-chunks", "2", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert f"{paths['text']}: the text has " in err and "fewer than --chunks 200" in err


def _spy(monkeypatch):
    seen = {"calib": [], "score": []}
    real_ppl, real_im = gate.perplexity, gate.collect_imatrix

    def ppl(model, tokens, **kw):
        seen["score"].append((np.array(tokens), kw["chunks"], kw["n_ctx"]))
        return real_ppl(model, tokens, **kw)

    def im(model, tokens, **kw):
        seen["calib"].append((np.array(tokens), kw["chunks"]))
        return real_im(model, tokens, **kw)
    monkeypatch.setattr(gate, "perplexity", ppl)
    monkeypatch.setattr(gate, "collect_imatrix", im)
    return seen


def test_gate_calibrates_on_held_out_tokens(shared, monkeypatch, tmp_path, capsys):
    st = shared / "models" / "stories260K"
    text = shared / "text" / "tinystories-val-B.txt"
    seen = _spy(monkeypatch)
    rows, out = gate.run_gate(st / "stories260K-F16.gguf", st / "stories260K-Q4_0.gguf", text, n_ctx=128, chunks=3,
                              calib_chunks=4, out_dir=tmp_path, progress=False)
    log = capsys.readouterr().out
    full = tokens_for_ppl(orkpy.load_model(st / "stories260K-F16.gguf"), read_text_like_llama_cpp(text))
    (calib, cchunks), = seen["calib"]
    assert cchunks == 4 and len(calib) == 4 * 128 and np.array_equal(calib, full[-4 * 128:])
    assert len(seen["score"]) == 3
    for score, chunks, n_ctx in seen["score"]:
        assert np.array_equal(score, full[:len(score)]) and chunks * n_ctx <= len(full) - len(calib)
    assert "its first 3 chunks of 128 tokens (tokens 0-383)" in log
    assert f"its last 4 chunks (tokens {len(full) - 512}-{len(full) - 1}), held out: never scored" in log
    # the same when --calib names the evaluation text itself
    seen["calib"].clear()
    gate.run_gate(st / "stories260K-F16.gguf", st / "stories260K-Q4_0.gguf", text, calib_path=text, n_ctx=128,
                  chunks=3, calib_chunks=4, out_dir=tmp_path, progress=False)
    assert np.array_equal(seen["calib"][0][0], full[-4 * 128:])
    assert "--calib is the evaluation text" in capsys.readouterr().out


def test_synthetic_gate_calibrates_on_its_own_text(monkeypatch, capsys):
    seen = _spy(monkeypatch)
    assert main(["gate"] + FAST) == 0
    out = capsys.readouterr().out
    assert "scoring:     synthetic-text.txt" in out and "calibration: synthetic-calib.txt" in out
    score = seen["score"][0][0]
    calib = seen["calib"][0][0]
    assert len(calib) > 512 and not np.array_equal(calib[:512], score[:512])
    windows = {score[i:i + 16].tobytes() for i in range(0, len(score) - 16)}
    assert sum(calib[i:i + 16].tobytes() in windows for i in range(0, len(calib) - 16, 16)) < 3


# ------------------------------------------------------------ temp files --

@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    d = tmp_path / "tmp"
    d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    monkeypatch.setenv("TMPDIR", str(d))
    return d


@pytest.mark.slow
def test_gate_and_ffn_sweep_leave_no_temp_files(private_tmp, shared, capsys):
    assert main(["gate"] + FAST) == 0
    assert "temporary files removed" in capsys.readouterr().out
    assert os.listdir(private_tmp) == []
    text = read_text_like_llama_cpp(shared / "text" / "tinystories-val-B.txt")
    from orkpy.evaluation.ffn import sweep
    calib = read_text_like_llama_cpp(shared / "text" / "wikitext-2-raw-test.txt")  # never the scored text
    rows, _ = sweep(str(shared / "models" / "stories260K" / "stories260K-F32.gguf"), text, calib, n_ctx=64, chunks=2,
                    calib_chunks=2)
    assert len(rows) > 10 and os.listdir(private_tmp) == []
    from orkpy.evaluation.table import ppl_table
    rows = ppl_table(str(shared / "models" / "stories260K"), text, n_ctx=64, chunks=2, calib_chunks=2)
    assert len(rows) == 14 and os.listdir(private_tmp) == []


def test_gate_out_keeps_files_and_says_where(private_tmp, tmp_path, capsys):
    out = tmp_path / "kept" / "gate"                       # a missing parent folder is created
    assert main(["gate", "--out", str(out)] + FAST) == 0
    text = capsys.readouterr().out
    assert f"kept in {out}: model-imatrix/" in text and f"in {out / 'synthetic'}" in text
    assert sorted(os.listdir(out)) == ["model-imatrix", "model-plain", "source-logprobs.npz", "synthetic"]
    assert (out / "synthetic" / "synthetic-F16.gguf").is_file()
    assert os.listdir(private_tmp) == []


def test_gate_out_is_checked_first(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["gate", "--out", str(f)] + FAST) == 1
    err = capsys.readouterr()
    assert str(f) in err.err and "source:" not in err.out          # failed before any work


# ------------------------------------------------------- reproducibility --

def _hashes(d):
    return {n: hashlib.sha256(open(os.path.join(d, n), "rb").read()).hexdigest() for n in sorted(os.listdir(d))}


def _in_process(code, seed, cwd):
    env = dict(os.environ, PYTHONHASHSEED=str(seed), PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_synthetic_model_is_byte_identical_across_hash_seeds(tmp_path):
    code = "from orkpy.evaluation.synthetic import make_synthetic; make_synthetic('m')"
    for seed in (1, 2):
        (tmp_path / str(seed)).mkdir()
        _in_process(code, seed, tmp_path / str(seed))
    a, b = _hashes(tmp_path / "1" / "m"), _hashes(tmp_path / "2" / "m")
    assert a == b and len(a) == 4
    make_synthetic(tmp_path / "here")
    assert a == _hashes(tmp_path / "here")                      # and the same as in this process


def test_synthetic_gate_table_identical_across_hash_seeds(tmp_path):
    code = "import sys; from orkpy.cli import main; sys.exit(main(['gate', '--chunks', '3', '--calib-chunks', '2', " \
           "'--no-progress']))"
    tables = [_rows(_in_process(code, seed, tmp_path)) for seed in (3, 4)]
    assert len(tables[0]) == 3 and tables[0] == tables[1]


# ------------------------------------------------------- labels, shares --

def test_one_int8_share(shared, capsys):
    st = shared / "models" / "stories260K"
    q = shared / "models" / "qwen3-skeleton"
    for src, alloc, want in ((st / "stories260K-F16.gguf", st / "stories260K-Q4_0.gguf", "34.1%"),
                             (st / "stories260K-F16.gguf", st / "stories260K-Q3_K_M.gguf", None),
                             (q / "qwen3-skel-tied-F16.gguf", q / "qwen3-skel-tied-Q4_K_M.gguf", None)):
        tm = orkpy.tier_map(alloc)
        qm = orkpy.quantize_model(src, alloc, progress=False, log=lambda m: None)
        assert tm.result_bytes() == qm.result_bytes() and tm.int8_share() == qm.int8_share()
        assert want is None or f"{tm.int8_share():.1%}" == want
    # the tier-map command prints the same figure under the same name
    assert main(["tier-map", str(st / "stories260K-Q4_0.gguf")]) == 0
    assert "int8 share of weight storage: 34.1" in capsys.readouterr().out


def test_labels_say_what_ran(tmp_path, capsys):
    paths = make_synthetic(tmp_path / "m")
    tm = TierMap.load(paths["alloc"])
    all8 = TierMap({n: TierEntry("int8" if e.tier == "int4" else e.tier, e.ggml_type, e.shape)
                    for n, e in tm.entries.items()}, tied=tm.tied)
    all8.save(tmp_path / "all-int8.map")
    assert main(["gate", paths["model"], str(tmp_path / "all-int8.map"), paths["text"], "--calib", paths["calib"]]
                + FAST) == 0
    out = capsys.readouterr().out
    rows = _rows(out)
    assert [r.split("  ")[0] for r in rows] == [
        "source (float)", "ours: alloc + imatrix (all int8)", "ours without imatrix (all int8)"]
    assert "; no int4 linears: every linear is int8 (--kind nf4 is unused)" in out
    assert "nf4" not in "".join(rows) and rows[1].endswith("100.0%")
    # each quantize log line names the model it is about
    q = [line for line in out.splitlines() if "] quantized " in line]
    assert len(q) == 2 and q[0].startswith("[ours: alloc + imatrix (all int8") and q[1].startswith("[ours without")
    assert "int8 share of weight storage 100.0%" in q[0]
