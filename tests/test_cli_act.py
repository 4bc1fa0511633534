"""The activation-mode and rotation flags of the CLI: ppl --act/--rotate/--smooth/--calib,
quantize --rotate --calib (static ranges saved with the model), ffn-sweep --act/--rotate."""
import json

import pytest

from orkpy.cli import main

ST = "models/stories260K/stories260K-"


def _ppl(capsys, argv):
    capsys.readouterr()
    assert main(["ppl", *argv, "--json", "--no-progress"]) == 0
    return json.loads(capsys.readouterr().out)["ppl"]


@pytest.fixture
def texts(shared):
    return str(shared / "text" / "tinystories-val-B.txt"), str(shared / "text" / "wikitext-2-raw-test.txt")


def test_ppl_act_modes_and_rotation(shared, texts, capsys):
    text, calib = texts
    base = [str(shared / (ST + "F32.gguf")), text, "-c", "128", "--chunks", "6"]
    f32 = _ppl(capsys, base + ["--weights", "fp32"])
    rot = _ppl(capsys, base + ["--weights", "fp32", "--rotate", "hadamard"])
    assert rot == pytest.approx(f32, rel=1e-4) and rot != f32  # the same function, other roundings
    tok = _ppl(capsys, base + ["--weights", "int8"])
    ten = _ppl(capsys, base + ["--weights", "int8", "--act", "per_tensor"])
    sta = _ppl(capsys, base + ["--weights", "int8", "--act", "static", "--calib", calib, "--calib-chunks", "2"])
    assert len({f32, tok, ten, sta}) == 4


@pytest.mark.parametrize("argv, msg", [
    (["--act", "static"], "--act static needs calibrated activations"),
    (["--act", "per_token_outliers"], "--act per_token_outliers needs calibrated"),
    (["--smooth", "0.5"], "--smooth needs --calib"),
])
def test_ppl_bad_act_flags(shared, texts, capsys, argv, msg):
    assert main(["ppl", str(shared / (ST + "F32.gguf")), texts[0], "--weights", "int8", "--no-progress", *argv]) == 2
    assert msg in capsys.readouterr().err


@pytest.mark.parametrize("argv, msg", [(["--smooth", "2"], "outside [0, 1]"), (["--act", "dynamic"], "invalid choice")])
def test_ppl_bad_act_values(shared, texts, capsys, argv, msg):
    with pytest.raises(SystemExit) as e:
        main(["ppl", str(shared / (ST + "F32.gguf")), texts[0], "--no-progress", *argv])
    assert e.value.code == 2 and msg in capsys.readouterr().err


def test_quantize_rotated_with_static_ranges_then_ppl(shared, texts, tmp_path, capsys):
    text, calib = texts
    out = tmp_path / "rot"
    assert main(["quantize", str(shared / (ST + "F32.gguf")), "--alloc", str(shared / (ST + "Q4_K_M.gguf")),
                 "--rotate", "hadamard", "--calib", calib, "--calib-ctx", "128", "--calib-chunks", "2",
                 "-o", str(out), "--no-progress"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert "hadamard" in json.dumps(manifest) and (out / "act_scales.json").is_file()
    base = [str(out), text, "-c", "128", "--chunks", "6"]
    dyn = _ppl(capsys, base)
    sta = _ppl(capsys, base + ["--act", "static"])  # the model directory's own calibration
    assert dyn != sta and sta < 2 * dyn


def test_ffn_sweep_act_and_rotation(shared, texts, tmp_path, capsys):
    """ffn-sweep --act/--rotate: its per-op baseline row is the ppl command's int8 model in that
    mode; the fused chain runs on it; the online rotation is refused (the chain does not model it)."""
    text, calib = texts
    model = str(shared / (ST + "F32.gguf"))
    out = tmp_path / "sweep.jsonl"
    args = ["--act", "per_tensor", "--rotate", "hadamard"]
    assert main(["ffn-sweep", model, text, "--calib", calib, "-c", "128", "--chunks", "4", "--calib-chunks", "4",
                 "--sens-chunks", "2", "--json-out", str(out), "--no-progress", *args]) == 0
    rows = {r["mode"]: r for r in map(json.loads, out.read_text().splitlines())}
    want = _ppl(capsys, [model, text, "-c", "128", "--chunks", "4", "--weights", "int8", *args])
    assert rows["baseline"]["ppl"] == pytest.approx(want, rel=1e-12)
    assert rows["fused"]["ppl"] != rows["baseline"]["ppl"]
    assert main(["ffn-sweep", model, text, "--calib", calib, "--rotate", "hadamard", "--rotate-online",
                 "--no-progress"]) == 1
    assert "rotate_online" in capsys.readouterr().err
