"""A newcomer's defects (issue 40), each with a test that failed before its fix: the set-up says what it
builds and downloads and how to skip it; --target-bpw checks its size first, in bits per weight, and says
what its sensitivity pass will cost; no command's help advertises an option it refuses; the closing line
gives the model's size on disk and its NPU bytes per token; a 4-bit oracle that maps to all int8 is
said; settings measured to hurt are said; --weights' wording; the README's blocks run in the REPL too.
(The manifest-version message: tests/test_writes_and_maps.py; the server, the plugin, the named
recipes: tests/test_server.py, tests/test_pytest_plugin.py, tests/test_named_recipes.py.)"""
import argparse
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT
from orkpy.cli import SUBCOMMANDS, build_parser, main

ST = "models/stories260K/"


# 1. the set-up command says what it does
def test_setup_says_it_builds_llama_cpp_and_how_to_skip_it():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    setup = readme[readme.index("## Set-up"):][:2500]
    for words in ("llama.cpp", "350 MB", "20-30 minutes", "ORKPY_NO_ORACLE=1"):
        assert words in setup, f"the README's set-up does not say {words!r}"
    install = (ROOT / ".ci" / "install").read_text(encoding="utf-8")
    assert 'if [ "${ORKPY_NO_ORACLE:-0}" = 1 ]' in install and "350 MB" in install
    oracle = (ROOT / ".ci" / "llama-oracle").read_text(encoding="utf-8")
    assert "5-8 minutes" not in oracle and "20-30 minutes" in oracle and "log: $ROOT/build.log" in oracle
    # the progress filter prints the build's percentages, each 10 % once
    flt = re.search(r"awk '(.*?)'", oracle, re.S).group(1)
    out = subprocess.run(["awk", flt], input="[  3%] a\n[ 12%] b\n[ 15%] c\n[ 31%] d\n[100%] e\n", text=True,
                         capture_output=True, check=True).stdout
    assert out.splitlines() == ["llama.cpp build: 10%", "llama.cpp build: 30%", "llama.cpp build: 100%"]


# 3. and 4. --target-bpw: the size checked before any work, in bits per weight; the cost said before it is paid
def test_target_bpw_too_small_fails_first_in_bits_per_weight(shared, tmp_path, capsys, monkeypatch):
    import orkpy.quantization.alloc as alloc
    monkeypatch.setattr(alloc, "sensitivities", lambda *a, **k: pytest.fail("measured before the size check"))
    calib = tmp_path / "c.txt"
    calib.write_text("Once upon a time there was a cat. " * 200)
    rc = main(["quantize", str(shared / ST / "stories260K-F16.gguf"), "--target-bpw", "4.0", "--calib", str(calib),
               "--no-progress", "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 1
    m = re.search(r"target_bpw=4 is below the smallest size these tiers reach on this model: (\d\.\d{3}) bits per "
                  r"weight .* give a target of at least (\d\.\d\d)", err)
    assert m, err
    assert 4.0 < float(m.group(1)) <= float(m.group(2)) < float(m.group(1)) + 0.011


def test_target_bpw_says_what_the_sensitivity_pass_costs(shared, tmp_path, capsys):
    import orkpy
    from orkpy.quantization.alloc import sensitivities
    src = orkpy.formats.source.open_source(shared / ST / "stories260K-F32.gguf")
    text = (shared / "text" / "tinystories-val-B.txt").read_text(encoding="utf-8")[200000:230000]
    sensitivities(src, text, ("int4", "int8"), n_ctx=64, chunks=1, threads=1, progress=True, method="per_linear")
    err = capsys.readouterr().err
    assert re.search(r"sensitivity: 36 linears measured one at a time, each a forward pass over 1 x 64 tokens: "
                     r"about \d+ s here", err), err


# 5. and 13. the help of every command names only options it takes; --weights' words
def test_no_help_advertises_an_option_its_command_refuses():
    p = build_parser()
    subs = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(subs) == {name for name, _ in SUBCOMMANDS}
    for name, sp in subs.items():
        accepted = {o for a in sp._actions for o in a.option_strings}
        helped = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]+)", sp.format_help()))
        assert helped <= accepted, f"orkpy {name} --help names {sorted(helped - accepted)}, which it refuses"


def test_weights_option_words_and_help(capsys):
    from orkpy.runtime.model import PATHS
    assert main(["ppl", "m.gguf", "t.txt", "--weights", "int7"]) == 2
    err = capsys.readouterr().err
    assert "--weights 'int7': not a weight path (one of fp32, gguf" in err and "path name" not in err
    for cmd in ("ppl", "generate", "serve"):
        with pytest.raises(SystemExit):
            main([cmd, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "|".join(PATHS) in text.replace("| ", "|"), cmd


def test_gate_says_why_its_context_differs_from_ppl(capsys):
    with pytest.raises(SystemExit):
        main(["gate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "default 256: the context of the stories260K figures" in text and "ppl and imatrix default to 512" in text


# 6. the closing line: the size on disk and the NPU bytes per token
def test_quantize_prints_the_size_and_npu_bytes(shared, tmp_path, capsys):
    out = tmp_path / "q"
    assert main(["quantize", str(shared / ST / "stories260K-F16.gguf"), "--alloc", str(shared / ST /
                 "stories260K-Q4_0.gguf"), "--no-progress", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    m = re.search(r"size: ([\d.]+) MB on disk \(float\.gguf ([\d.]+) MB of it\); NPU weight bytes per token "
                  r"([\d.]+) MB \(([\d.]+) bits per packed weight", text)
    assert m, text
    on_disk = sum(f.stat().st_size for f in out.iterdir() if f.is_file()) / 1e6
    assert float(m.group(1)) == pytest.approx(on_disk, abs=0.006)
    assert float(m.group(2)) == pytest.approx((out / "float.gguf").stat().st_size / 1e6, abs=0.006)
    assert float(m.group(4)) >= 8.0   # every tier of this allocation reads as int8 on the NPU (padding: more)


@pytest.mark.slow
def test_a_tied_table_stored_quantized_is_kept_in_float16(tmp_path, capsys):
    """SmolLM2's tied embedding table is Q8_0 in its file: the model directory keeps it as F16 (56.6 MB), not
    as its F32 dequantization (113 MB), and the closing line points to --tied-lookup packed."""
    from oracle import real_model

    import orkpy
    from orkpy.formats.gguf import GGUFFile
    src = real_model("smollm2")
    out = tmp_path / "smol"
    assert main(["quantize", str(src), "--alloc", str(src), "--no-progress", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    table = GGUFFile(out / "float.gguf").tensor_info("token_embd.weight")
    assert table.type == "F16" and (out / "float.gguf").stat().st_size < 60e6
    assert "--tied-lookup packed stores it once" in text
    m = orkpy.load_model(out)
    ids = m.tokens("The capital of France is")
    ref = GGUFFile(src).tensor("token_embd.weight")[ids]   # the Q8_0 rows, dequantized
    got = GGUFFile(out / "float.gguf").tensor("token_embd.weight")[ids]
    assert np.allclose(got, ref, rtol=2 ** -10, atol=1e-6)


# 7. a 4-bit oracle that maps every linear to int8 is said, with the threshold that would not
def test_a_4_bit_oracle_mapping_to_all_int8_is_said(shared):
    from orkpy.formats.gguf import GGUFFile
    from orkpy.formats.source import read_allocation
    from orkpy.quantization.pipeline import four_bit_oracle_note
    q4 = shared / ST / "stories260K-Q4_0.gguf"
    assert GGUFFile(q4).metadata["general.file_type"] == 2   # MOSTLY_Q4_0
    # below Q4_0's 4.5 bits per weight every linear is int8 (as Q4_1's 5.0 at the default threshold 5)
    a = read_allocation(q4, threshold=4.0)
    note = four_bit_oracle_note(a, a.tiers)
    assert note is not None and "stories260K-Q4_0.gguf is a MOSTLY_Q4_0 file, but at threshold 4" in note
    assert "--threshold 4.75" in note
    for path in (q4, shared / ST / "stories260K-Q8_0.gguf"):   # a mixed map; an 8-bit file: nothing to say
        b = read_allocation(path)
        assert four_bit_oracle_note(b, b.tiers) is None


# 8. settings measured to hurt are said, with the figure and the way out
def test_known_bad_settings_are_said():
    from orkpy.quantization.named import known_bad
    from orkpy.quantization.recipe import Recipe
    d = Recipe().to_dict()
    assert known_bad(Recipe()) == []
    d["transform"]["rotate"] = "hadamard"
    (w,) = known_bad(Recipe.from_dict(d))
    assert "round to nearest was measured much worse" in w and "0.489" in w and "--recipe q4km" in w
    d["rounding"]["method"] = "gptq"
    assert known_bad(Recipe.from_dict(d)) == []   # 8 x 512 tokens
    d["calibration"]["chunks"] = 4
    (w,) = known_bad(Recipe.from_dict(d))
    assert "GPTQ on 4 x 512 = 2048 calibration tokens" in w and "0.272" in w


# 9. the README's blocks run when pasted into the interactive interpreter, not only as a script
@pytest.mark.slow
def test_readme_blocks_run_in_the_repl(tmp_path):
    from test_readme import BLOCKS
    if not (ROOT.parent / "shared").is_dir():
        pytest.skip("the README's examples read ../shared")
    failed = []
    for i, (code, head) in enumerate(BLOCKS):
        p = subprocess.run([sys.executable, "-i", "-q"], input=code + "\n\n", cwd=ROOT, capture_output=True,
                           text=True, timeout=300, env={**os.environ, "TMPDIR": str(tmp_path)})
        if any(re.match(r"(Traceback|\w*Error\b)", line) for line in p.stderr.splitlines()):
            failed.append(f"block {i} ({head}):\n{p.stderr[-1500:]}")
    assert not failed, "blocks that fail in the REPL:\n" + "\n".join(failed)


def test_repl_check_catches_a_loop_followed_by_a_statement():
    code = "for i in range(2):\n    pass\nx = 1\nprint(x)\n"
    p = subprocess.run([sys.executable, "-i", "-q"], input=code + "\n", capture_output=True, text=True, timeout=60)
    assert "SyntaxError" in p.stderr
