"""The CLI's conventions (issue 12, "llama.cpp users arrive with llama.cpp habits"): llama-perplexity /
llama-imatrix spellings, one meaning per flag, help with defaults, exit codes 0/1/2/130, output paths
checked before any work, errors that name the user's file and tensor, the NPU / context / npu-dump checks,
and the Python API rules (Imatrix.save by extension, x @ pw.T, orkpy.runtime.npu after import orkpy)."""
import argparse
import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

import orkpy
from orkpy import cli
from orkpy.cli import main

ST = ("models", "stories260K")


@pytest.fixture
def files(shared):
    st = shared.joinpath(*ST)
    return {"f32": str(st / "stories260K-F32.gguf"), "f16": str(st / "stories260K-F16.gguf"),
            "q4": str(st / "stories260K-Q4_0.gguf"), "text": str(shared / "text" / "tinystories-val-B.txt")}


@pytest.fixture
def no_model_load(monkeypatch):
    """Fail the test if a command gets as far as loading a model (or running the expensive step)."""
    def boom(*a, **k):
        raise AssertionError("the expensive step ran before the argument/path check")
    import orkpy.quantization.calibrate
    import orkpy.evaluation.ffn
    import orkpy.runtime.model
    import orkpy.formats.tiermap
    monkeypatch.setattr(orkpy.runtime.model, "load_model", boom)
    monkeypatch.setattr(orkpy.quantization.calibrate, "quantize_model", boom)
    monkeypatch.setattr(orkpy.evaluation.ffn, "sweep", boom)
    monkeypatch.setattr(orkpy.formats.tiermap, "tier_map", boom)
    return boom


def _ppl_json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def _subparsers():
    p = cli.build_parser()
    (action,) = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    return p, action.choices


# ------------------------------------------------------------ aliases ----

def test_ppl_llama_cpp_spellings_give_identical_results(files, capsys):
    old = _ppl_json(capsys, ["ppl", files["f32"], files["text"], "--ctx", "128", "--chunks", "3", "--threads", "2",
                             "--no-progress", "--json"])
    for argv in (["-m", files["f32"], "-f", files["text"], "-c", "128", "-t", "2"],
                 ["--model", files["f32"], "--file", files["text"], "--ctx-size", "128", "--threads", "2"],
                 ["-m", files["f32"], files["text"], "-c", "128"],      # -m with a positional TEXT
                 ["-f", files["text"], files["f32"], "-c", "128"]):     # -f with a positional MODEL
        new = _ppl_json(capsys, ["ppl", *argv, "--chunks", "3", "--no-progress", "--json"])
        assert (new["ppl"], new["ppl_err"], new["chunks"], new["n_ctx"]) == \
            (old["ppl"], old["ppl_err"], old["chunks"], old["n_ctx"])


def test_batch_size_is_accepted_and_changes_nothing(files, capsys):
    base = ["ppl", files["f32"], files["text"], "-c", "128", "--chunks", "2", "--no-progress", "--json"]
    ref = _ppl_json(capsys, base)
    assert main(base + ["-b", "64"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["ppl"] == ref["ppl"]
    assert "-b/--batch-size 64" in out.err and "no effect on results" in out.err
    assert main(base + ["-b", "2048"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["ppl"] == ref["ppl"] and "batch-size" not in out.err
    with pytest.raises(SystemExit) as e:
        main(base + ["-b", "0"])
    assert e.value.code == 2


def test_imatrix_llama_cpp_spellings_give_identical_files(files, tmp_path, capsys):
    a, b = tmp_path / "a.dat", tmp_path / "b.dat"
    assert main(["imatrix", files["f32"], files["text"], "--ctx", "128", "--chunks", "3", "-o", str(a),
                 "--no-progress"]) == 0
    assert main(["imatrix", "-m", files["f32"], "-f", files["text"], "-c", "128", "--chunks", "3", "-t", "1",
                 "-o", str(b), "--no-progress"]) == 0
    assert a.read_bytes() == b.read_bytes()


def test_kl_divergence_spellings(files, tmp_path, capsys):
    base = tmp_path / "base.npz"
    common = [files["text"], "-c", "128", "--chunks", "3", "--no-progress", "--json"]
    # llama-perplexity: --kl-divergence-base F alone writes the reference ...
    src = _ppl_json(capsys, ["ppl", files["f32"], *common, "--kl-divergence-base", str(base)])
    assert base.is_file() and src["kld"] is None
    # ... and with --kl-divergence reads it: the same numbers as orkpy's --kld-base
    new = _ppl_json(capsys, ["ppl", files["q4"], *common, "--kl-divergence-base", str(base), "--kl-divergence"])
    old = _ppl_json(capsys, ["ppl", files["q4"], *common, "--kld-base", str(base)])
    assert new["kld"] == old["kld"] and new["kld"]["mean"] > 0
    assert new["kld"]["ppl_base"] == src["ppl"]


@pytest.mark.parametrize("argv, msg", [
    (["--kl-divergence"], "--kl-divergence needs the reference"),
    (["--kl-divergence-base", "x.npz", "--save-logprobs", "y.npz"], "do not also give --save-logprobs"),
    (["--kl-divergence-base", "x.npz", "--kld-base", "y.npz"], "do not also give --save-logprobs or --kld-base"),
])
def test_kl_flag_conflicts_are_usage_errors(files, argv, msg, no_model_load, capsys):
    assert main(["ppl", files["f32"], files["text"], *argv]) == 2
    assert msg in capsys.readouterr().err


def test_model_given_twice_or_missing_is_a_usage_error(files, no_model_load, capsys):
    assert main(["ppl", "-m", files["f32"], files["f32"], files["text"]]) == 2
    err = capsys.readouterr().err
    assert "MODEL (-m/--model) given both as an option and as a positional argument" in err
    assert main(["ppl", "-f", files["text"]]) == 2
    assert "missing MODEL: give it as a positional argument or with -m/--model" in capsys.readouterr().err
    assert main(["imatrix", "-m", files["f32"], "-o", "x.gguf"]) == 2
    assert "missing TEXT" in capsys.readouterr().err
    assert main(["ffn-sweep", "-m", files["f32"], "-f", files["text"], files["text"], "--calib", "c"]) == 2
    assert "TEXT (-f/--file) given both" in capsys.readouterr().err


# ------------------------------------------------- one meaning per flag --

def test_every_option_has_help_with_its_default_and_no_rest_markup():
    p, subs = _subparsers()
    texts = [p.format_help()]
    for name, sp in subs.items():
        text = sp.format_help()
        texts.append(text)
        assert "exit status:" in text and "130" in text, name
        for a in sp._actions:
            if isinstance(a, (argparse._HelpAction, argparse._VersionAction)) or a.help == argparse.SUPPRESS:
                continue
            assert a.help, f"{name} {a.option_strings or a.dest}: no help text"
            if a.option_strings and not a.required:
                shown = sp._get_formatter()._expand_help(a)
                assert "default" in shown, f"{name} {a.option_strings}: no default in {shown!r}"
                assert "default: None" not in shown, f"{name} {a.option_strings}: {shown!r}"
    for t in texts:
        assert "``" not in t and ":class:" not in t and ":func:" not in t


def test_json_is_a_switch_and_output_is_a_path_everywhere():
    _, subs = _subparsers()
    seen = set()
    for name, sp in subs.items():
        for a in sp._actions:
            if "--json" in a.option_strings:
                assert isinstance(a, argparse._StoreTrueAction), name
                seen.add(name)
            if "--output" in a.option_strings and a.help != argparse.SUPPRESS:
                assert a.choices is None and a.metavar in ("FILE", "DIR"), name
    assert {"info", "ppl", "ffn-sweep", "npu-plan", "quant-report"} <= seen
    assert not re.search(r"--output(?!-)", subs["tier-map"].format_help())  # the old spelling is hidden


def test_every_option_a_help_names_is_one_its_command_takes():
    """A command's help names only options that command accepts (generate --help advertised --meta, and
    quantize --help "--calib-chunks: chunks of --ctx tokens", options they refuse with exit 2)."""
    _, subs = _subparsers()
    for name, sp in subs.items():
        takes = {o for a in sp._actions for o in a.option_strings}
        named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", sp.format_help()))
        assert named <= takes, f"orkpy {name} --help names {sorted(named - takes)}, which {name} does not take"


def test_generate_refuses_meta_and_says_nothing_of_it(capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "m.gguf", "-p", "x", "--meta", "m.gguf"])
    assert e.value.code == 2
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    assert "--meta" not in capsys.readouterr().out


def test_tier_map_output_tier_and_the_hidden_old_spelling(files, tmp_path, capsys):
    maps = {}
    for key, argv in (("default", []), ("new", ["--output-tier", "int8"]), ("head", ["--head", "int8"]),
                      ("old", ["--output", "int8"])):
        out = tmp_path / f"{key}.map"
        assert main(["tier-map", files["q4"], *argv, "--emit-map", str(out)]) == 0
        maps[key] = orkpy.TierMap.load(str(out))
    capsys.readouterr()
    assert maps["default"]["output.weight"] == "int4"
    assert maps["new"]["output.weight"] == maps["head"]["output.weight"] == maps["old"]["output.weight"] == "int8"


def test_ffn_sweep_json_switch_json_out_and_no_progress(files, tmp_path, monkeypatch, capsys):
    import orkpy.evaluation.ffn
    calls = []
    rows = [{"mode": "baseline", "exact_layers": [0], "ppl": 6.5, "ppl_err": 0.1, "kl": 0.0, "wall_s": 1.0},
            {"mode": "fused", "exact_layers": [], "ppl": 6.9, "ppl_err": 0.1, "kl": 0.01, "wall_s": 1.0}]

    def fake_sweep(model, text, calib, **kw):
        calls.append(kw)
        return rows, [{"gmax": 1.0}]
    monkeypatch.setattr(orkpy.evaluation.ffn, "sweep", fake_sweep)
    out = tmp_path / "new" / "rows.jsonl"
    argv = ["ffn-sweep", files["f32"], files["text"], "--calib", files["text"]]
    assert main(argv + ["--json", "--json-out", str(out), "--no-progress"]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert printed == rows == [json.loads(line) for line in out.read_text().splitlines()]
    assert calls[-1]["progress"] is False
    assert main(argv) == 0
    assert "gmax per layer" in capsys.readouterr().out and calls[-1]["progress"] is True


# ------------------------------------------------------------ exit codes --

def test_exit_codes_0_1_2(files, tmp_path, capsys):
    assert main(["info"]) == 0
    assert main(["gguf-info", str(tmp_path / "missing.gguf")]) == 1        # a missing file: runtime
    assert "missing.gguf" in capsys.readouterr().err
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all")
    assert main(["gguf-info", str(bad)]) == 1                              # FormatError: runtime
    assert main(["ppl", files["f32"], files["text"], "--weights", "nonsense"]) == 2   # our usage error
    assert "--weights 'nonsense'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:                                   # argparse's usage error
        main(["ppl", files["f32"], files["text"], "--ctx", "7"])
    assert e.value.code == 2


def test_keyboard_interrupt_is_130_without_traceback(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "_cmd_info", interrupted)
    assert main(["info"]) == 130
    assert capsys.readouterr().err == "orkpy info: interrupted\n"


def test_sigint_in_a_real_process_exits_130_with_one_line():
    code = ("import os, signal, sys, time\nimport orkpy.cli as c\n"
            "def slow(args):\n    os.kill(os.getpid(), signal.SIGINT)\n    time.sleep(60)\n"
            "c._cmd_info = slow\nsys.exit(c.main(['info']))\n")
    # a shell's background job starts with SIGINT ignored, and Python then installs no handler of its own:
    # give the child the default disposition, as a terminal's foreground process has
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert r.returncode == 130
    assert r.stderr == "orkpy info: interrupted\n"


@pytest.mark.parametrize("exc", [TypeError("a bug"), KeyError("a bug")])
def test_bugs_keep_their_traceback(monkeypatch, exc):
    def buggy(args):
        raise exc
    monkeypatch.setattr(cli, "_cmd_info", buggy)
    with pytest.raises(type(exc)):
        main(["info"])


# ------------------------------------------------- output paths, early --

def test_output_paths_are_checked_before_any_work(files, tmp_path, no_model_load, capsys):
    afile = tmp_path / "a-file"
    afile.write_text("x")
    under = str(afile / "out")
    cases = [
        ["imatrix", files["f32"], files["text"], "-o", under + ".gguf"],
        ["quantize", files["f16"], "--alloc", files["q4"], "-o", under],
        ["ppl", files["f32"], files["text"], "--save-logprobs", under + ".npz"],
        ["ppl", files["f32"], files["text"], "--kl-divergence-base", under + ".npz"],
        ["ffn-sweep", files["f32"], files["text"], "--calib", files["text"], "--json-out", under + ".jsonl"],
        ["tier-map", files["q4"], "--emit-map", under + ".map"],
        ["imatrix", files["f32"], files["text"], "-o", str(tmp_path)],            # a folder, not a file
    ]
    for argv in cases:
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert argv[-1] in err, (argv, err)
        assert "is a file, not a folder" in err or "is a folder, expected a file" in err, err


def test_quantize_existing_output_says_use_overwrite_before_quantizing(files, tmp_path, no_model_load, capsys):
    assert main(["quantize", files["f16"], "--alloc", files["q4"], "-o", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert str(tmp_path) in err and "use --overwrite" in err and "overwrite=True" not in err


def test_missing_output_folders_are_created(files, tmp_path, capsys):
    out = tmp_path / "new" / "deeper" / "im.gguf"
    assert main(["imatrix", files["f32"], files["text"], "-c", "128", "--chunks", "2", "-o", str(out),
                 "--no-progress"]) == 0
    assert orkpy.Imatrix.load(out).format == "gguf"


def test_check_output_path_helper(tmp_path):
    assert cli._check_output_path(tmp_path / "x" / "f.gguf", "--out") == str(tmp_path / "x" / "f.gguf")
    assert (tmp_path / "x").is_dir()
    cli._check_output_path(tmp_path / "y" / "dir", "--out", is_dir=True)  # parents made, the folder is the command's
    assert (tmp_path / "y").is_dir() and not (tmp_path / "y" / "dir").exists()
    (tmp_path / "f").write_text("")
    with pytest.raises(NotADirectoryError, match="--out .*is a file, expected a folder"):
        cli._check_output_path(tmp_path / "f", "--out", is_dir=True)
    with pytest.raises(FileExistsError, match="use --overwrite"):
        cli._check_output_path(tmp_path / "f", "--out", overwrite=False)


# ------------------------------------------- errors name file and tensor --

def test_imatrix_of_another_model_names_the_file_and_tensor(files, tmp_path, capsys):
    other = orkpy.Imatrix()
    other.add("blk.0.attn_q.weight", np.ones(256, np.float32), 1)   # stories260K has K = 64
    path = tmp_path / "other-model.gguf"
    other.save(path)
    with pytest.raises(ValueError, match=r"other-model\.gguf.*'blk\.0\.attn_q\.weight' has 256 values .* K = 64"):
        orkpy.quantize_model(files["f16"], files["q4"], imatrix=str(path), progress=False, log=lambda m: None)
    assert main(["quantize", files["f16"], "--alloc", files["q4"], "--imatrix", str(path),
                 "-o", str(tmp_path / "q"), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert str(path) in err and "blk.0.attn_q.weight" in err


def test_non_utf8_text_names_the_file_and_offset(files, tmp_path, no_model_load, capsys):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("Once upon a time ".encode() + b"caf\xe9")
    assert main(["ppl", files["f32"], str(bad)]) == 1
    err = capsys.readouterr().err
    assert str(bad) in err and "not UTF-8" in err and "offset 20" in err


def test_garbage_kld_base_names_the_file(files, tmp_path, capsys):
    bad = tmp_path / "garbage.npz"
    bad.write_bytes(os.urandom(512))
    assert main(["ppl", files["f32"], files["text"], "-c", "128", "--chunks", "2", "--no-progress",
                 "--kld-base", str(bad)]) == 1
    assert str(bad) in capsys.readouterr().err


# -------------------------------------------------- npu, ctx, info, dump --

def test_npu_without_packed_linears_is_refused(files, tmp_path, no_model_load, capsys):
    for w in ("gguf", "fp32"):
        assert main(["ppl", files["f32"], files["text"], "--npu", "emu", "--weights", w]) == 2
        err = capsys.readouterr().err
        assert f"--weights {w} has none" in err and "int8, nf4, int4" in err


def test_npu_with_an_all_float_map_is_refused(files, tmp_path, capsys):
    g = orkpy.GGUFFile(files["f32"])
    tm = orkpy.TierMap({t.name: orkpy.TierEntry("float", t.type, t.shape) for t in g.tensors})
    tm.save(str(tmp_path / "float.map"))
    assert main(["ppl", files["f32"], files["text"], "--npu", "emu", "--weights", str(tmp_path / "float.map"),
                 "-c", "128", "--chunks", "2", "--no-progress"]) == 2
    assert "no packed linear layer" in capsys.readouterr().err


def test_ctx_above_the_trained_context_warns(files, monkeypatch, capsys):
    import orkpy.evaluation.ppl

    def stop(*a, **k):
        raise ValueError("stopped after the checks")
    monkeypatch.setattr(orkpy.evaluation.ppl, "perplexity", stop)
    assert main(["ppl", files["f32"], files["text"], "-c", "4096"]) == 1
    err = capsys.readouterr().err
    assert "warning: --ctx 4096 is longer than the model's trained context 2048" in err
    assert main(["ppl", files["f32"], files["text"], "-c", "2048"]) == 1
    assert "warning" not in capsys.readouterr().err


def test_info_json_has_npu_availability(capsys):
    assert main(["info", "--json"]) == 0
    npu = json.loads(capsys.readouterr().out)["npu"]
    why = orkpy.runtime.npu.unavailable()
    assert set(npu) == set(orkpy.runtime.npu.BACKENDS)
    for b, v in npu.items():
        assert v == {"available": b not in why, "reason": why.get(b)}
    assert npu["emu"]["available"] is True


@pytest.mark.parametrize("data", [b"", bytes(13), bytes(64), "random"])
def test_npu_dump_refuses_what_is_not_a_command_stream(tmp_path, data, capsys):
    p = tmp_path / "x.bin"
    p.write_bytes(np.random.default_rng(7).integers(0, 256, 4096, dtype=np.uint8).tobytes()
                  if data == "random" else data)
    assert main(["npu-dump", str(p)]) == 1
    err = capsys.readouterr().err
    assert str(p) in err and "not an NPU command stream" in err


def test_npu_dump_accepts_a_planned_stream(tmp_path, capsys):
    q = orkpy.runtime.npu.plan_commands(4, 64, 64, 0x100000, 0x1000000, 0x10000000, 0x40000000, max_n=32)
    p = tmp_path / "plan.bin"
    p.write_bytes(q.astype("<u8").tobytes())
    assert main(["npu-dump", str(p)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(q)


# ------------------------------------------------------------ Python API --

def test_imatrix_save_picks_the_format_by_extension(tmp_path):
    im = orkpy.Imatrix(chunk_size=128, chunks=1)
    im.add("blk.0.attn_q.weight", np.arange(1, 65, dtype=np.float32), 2)
    for name, want in (("a.dat", "dat"), ("b.DAT", "dat"), ("c.gguf", "gguf"), ("d.imatrix", "gguf")):
        im.save(tmp_path / name)
        assert orkpy.Imatrix.load(tmp_path / name, chunk_size=128).format == want, name
    im.save(tmp_path / "e.dat", format="gguf")             # an explicit format wins
    assert orkpy.Imatrix.load(tmp_path / "e.dat").format == "gguf"
    im.save(tmp_path / "f.gguf", format="dat")
    assert orkpy.Imatrix.load(tmp_path / "f.gguf", chunk_size=128).format == "dat"


@pytest.mark.parametrize("kind", ["int8", "nf4"])
def test_matmul_operator_on_packed_weights(kind):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((64, 96)).astype(np.float32)
    pw = orkpy.pack(orkpy.quantize(w, kind))
    x = rng.standard_normal((5, 96)).astype(np.float32)
    assert pw.T.shape == (96, 64) and pw.T.T is pw
    assert np.array_equal(x @ pw.T, pw.matmul(x))
    assert np.array_equal(x[0] @ pw.T, pw.matmul(x[0]))
    xb = rng.standard_normal((2, 3, 96)).astype(np.float32)
    assert np.array_equal(xb @ pw.T, pw.matmul(xb.reshape(6, 96)).reshape(2, 3, 64))
    assert np.array_equal(x.tolist() @ pw.T, pw.matmul(x))
    # the NumPy meaning of the (N, K) matrix: x @ W.T, up to the int8 activation rounding
    ref = x @ pw.dequantize().T
    assert np.abs((x @ pw.T) - ref).max() < 0.02 * np.abs(ref).max()
    with pytest.raises(TypeError, match=r"pw\.T"):
        x @ pw
    with pytest.raises(ValueError, match="width K = 96"):
        x[:, :64] @ pw.T


def test_npu_is_an_attribute_after_import_orkpy():
    r = subprocess.run([sys.executable, "-c", "import orkpy; print(orkpy.runtime.npu.available())"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "emu" in r.stdout


def test_quantize_refuses_unrelated_folder_before_work(tmp_path, monkeypatch, capsys):
    """--overwrite replaces a model directory only; an unrelated non-empty folder fails before quantizing."""
    import orkpy.quantization.calibrate as calibrate
    out = tmp_path / "photos"
    out.mkdir()
    (out / "holiday.jpg").write_bytes(b"x")
    monkeypatch.setattr(calibrate, "quantize_model", lambda *a, **k: pytest.fail("quantized before the path check"))
    rc = main(["quantize", "src.gguf", "--alloc", "a.gguf", "-o", str(out), "--overwrite", "--no-progress"])
    assert rc == 1
    assert "not an orkpy model directory" in capsys.readouterr().err
    assert (out / "holiday.jpg").exists()
