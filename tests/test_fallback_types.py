"""The allocation oracle sees through llama.cpp's fallback types (issue 19): a tensor whose rows are
not a multiple of 256 is stored by llama-quantize on a 32-block substitute with more bits; the tier
map tiers it by the type llama.cpp intended. The oracle in the live tests is llama-quantize's own
log ("ncols N not divisible by 256 (required for type T) -> falling back to S")."""
import re
import warnings

import numpy as np
import pytest

import orkpy
from orkpy.formats.tiermap import FALLBACK, TierMap, intended_type

from oracle import llama_bin, real_model

_LOG = re.compile(r"warning: (\S+)\s+- ncols\s+(\d+) not divisible by\s+(\d+) \(required for type\s+(\S+)\) "
                  r"(?:\(WARNING: must use F16 due to unusual shape\) )?-> falling back to\s+(\S+)")


def fallbacks_of(log):
    """{tensor: (intended, stored)} from llama-quantize's log."""
    return {m.group(1): (m.group(4).upper(), m.group(5).upper()) for m in _LOG.finditer(log)}  # ggml's "q4_K"


def check_against_log(path, log):
    told = fallbacks_of(log)
    tm = orkpy.tier_map(path)
    two_d = {n: e for n, e in tm.entries.items() if len(e.shape) == 2}
    for n, e in two_d.items():
        if n in told:
            assert (e.intended, e.ggml_type) == told[n], n
        else:
            assert e.intended is None, (n, e)
    assert set(tm.fallbacks()) == set(told)
    return tm, told


def test_qwen3_skeleton_rows_of_256_have_no_fallback(shared):
    qwen = shared / "models/qwen3-skeleton"
    for f in ("qwen3-skel-tied-Q4_K_M.gguf", "qwen3-skel-untied-Q4_K_M.gguf"):
        tm = orkpy.tier_map(qwen / f)
        assert tm.fallbacks() == {}
        assert orkpy.tier_map(qwen / f, fallback="literal").entries == tm.entries


@pytest.mark.parametrize("name,stored,K,ft,want", [
    ("blk.3.attn_q.weight", "Q5_0", 576, 15, "Q4_K"),     # Q4_K_M: Q4_K -> Q5_0
    ("blk.0.attn_v.weight", "Q8_0", 576, 15, "Q6_K"),     # use_more_bits -> Q6_K -> Q8_0
    ("blk.0.attn_v.weight", "Q5_1", 576, 12, "Q5_K"),     # Q3_K_M's first attn_v: Q5_K -> Q5_1
    ("blk.5.ffn_up.weight", "Q4_0", 576, 12, "Q3_K"),     # Q3_K -> Q4_0 (current builds)
    ("blk.5.ffn_up.weight", "IQ4_NL", 576, 12, "Q3_K"),   # Q3_K -> IQ4_NL (older builds)
    ("blk.5.ffn_up.weight", "IQ4_NL", 576, 30, "IQ4_XS"),
    ("blk.5.ffn_up.weight", "F16", 80, 15, "Q4_K"),       # not even 32 divides: F16
    ("blk.5.ffn_up.weight", "Q5_0", 512, 15, None),       # 256 divides: no fallback happened
    ("blk.5.ffn_up.weight", "Q5_0", 576, 8, None),        # a Q5_0 file chose Q5_0
    ("blk.5.ffn_up.weight", "Q4_0", 576, 2, None),        # a Q4_0 file chose Q4_0
    ("token_embd.weight", "Q8_0", 576, 15, None),         # tied head, rows its Q4_K block does not divide: Q8_0 rule
    ("token_embd.weight", "Q8_0", 576, 2, "Q6_K"),        # Q4_0 file: the head's Q6_K falls back
    ("blk.5.ffn_up.weight", "Q5_0", 576, None, None),     # no file type: literal
])
def test_intended_type_rules(name, stored, K, ft, want):
    got, why = intended_type(name, stored, (1024, K), ft, n_layer=30, tied=True)
    assert got == want, why
    if want is not None:
        assert FALLBACK.get(want, "F16") == stored or stored in ("IQ4_NL", "F16")


def test_literal_mode_warns_and_emit_map_keeps_both_types(tmp_path):
    from orkpy.formats.gguf_write import write_gguf
    rng = np.random.default_rng(0)
    shapes = {f"blk.{i}.ffn_up.weight": (64, 576) for i in range(5)}
    meta = [("general.architecture", "STRING", "llama"), ("general.file_type", "UINT32", 15),
            ("llama.block_count", "UINT32", 5)]
    # a GGUF whose tensor types say Q5_0 (the fallback of Q4_K) on rows of 576; the tier map reads types only
    path = tmp_path / "m.gguf"
    write_gguf(path, meta, [(n, rng.standard_normal(s).astype(np.float32)) for n, s in shapes.items()])
    g = orkpy.GGUFFile(path)
    import orkpy.formats.tiermap as tmod

    class Fake:  # the same tensors, typed as llama-quantize would have stored them
        def __init__(self, t):
            self.name, self.shape, self.type = t.name, t.shape, "Q5_0"
    g.tensors = [Fake(t) for t in g.tensors]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tm = tmod.tier_map(g)
    assert set(dict(tm.items()).values()) == {"int4"}
    with pytest.warns(UserWarning, match=r"5 of 5 tensors are stored on llama.cpp fallback types \(rows of 576"):
        lit = tmod.tier_map(g, fallback="literal")
    assert set(dict(lit.items()).values()) == {"int8"} and lit.types == "stored"
    assert all(e.intended == "Q4_K" and e.ggml_type == "Q5_0" for e in lit.entries.values())
    for m in (tm, lit):
        f = tmp_path / f"{m.types}.map"
        m.save(f)
        text = f.read_text()
        assert text.startswith("# orkpy tier map v3\n") and f"# types: {m.types}\n" in text
        assert "\tQ5_0\t64x576\tQ4_K\n" in text
        assert TierMap.load(f) == m
    with pytest.raises(ValueError, match="fallback must be one of"):
        tmod.tier_map(g, fallback="guess")
    g.close()


def test_v2_maps_are_unchanged_when_nothing_fell_back(shared, tmp_path):
    tm = orkpy.tier_map(shared / "models/qwen3-skeleton/qwen3-skel-tied-Q4_K_M.gguf")
    tm.save(tmp_path / "a.map")
    assert (tmp_path / "a.map").read_text().startswith("# orkpy tier map v2\n")


@pytest.mark.slow
@pytest.mark.parametrize("qtype", ["Q4_K_M", "Q3_K_M", "Q4_0", "IQ4_XS"])
def test_inferred_types_equal_llama_quantize_log_on_smollm2(tmp_path, qtype, capsys):
    """SmolLM2-135M (rows of 576) quantized by the live llama-quantize: every tensor its log
    names as a fallback has exactly the intended and stored types the log prints; no other."""
    from orkpy.formats.convert import dequantize_gguf
    llama_bin("llama-quantize")
    f32 = tmp_path / "smollm2-F32.gguf"
    dequantize_gguf(real_model("smollm2"), f32)
    out = tmp_path / f"smollm2-{qtype}.gguf"
    import oracle
    log = oracle._run([llama_bin("llama-quantize"), f32, out, qtype, 2])
    tm, told = check_against_log(out, log)
    if qtype == "Q4_0":  # a 32-block file: only the tied head's Q6_K falls back (to Q8_0)
        assert told == {"token_embd.weight": ("Q6_K", "Q8_0")}
    else:
        assert len(told) > 20  # rows of 576: most tensors of a 256-block mix fall back
    if qtype == "Q4_K_M":
        lit = orkpy.tier_map(out, fallback="literal")
        assert tm.int8_share() < 0.6 < 0.9 < lit.int8_share()
        assert sum(1 for e in tm.fallbacks().values() if (e.ggml_type, e.intended) == ("Q5_0", "Q4_K")) > 100
        from orkpy.cli import main
        capsys.readouterr()
        assert main(["tier-map", str(out), "--emit-map", str(tmp_path / "i.map")]) == 0
        said = capsys.readouterr().out
        assert f"{len(told)} tensors read through a llama.cpp fallback type (rows of 576)" in said
        assert "tiered by the intended types" in said and TierMap.load(tmp_path / "i.map") == tm
        with pytest.warns(UserWarning, match="fallback types"):
            assert main(["tier-map", str(out), "--literal-types"]) == 0
        assert "(--literal-types)" in capsys.readouterr().out


@pytest.mark.slow
def test_inferred_types_equal_llama_quantize_log_on_gemma3(tmp_path):
    """Gemma-3-270M (rows of 640; the float weights are the shipped Q4_K_M's exact
    dequantization) re-quantized to Q4_K_M by the live llama-quantize: the tier map's
    intended / stored types equal what its log prints, and the shipped file's own map
    (made by another llama.cpp build) reads the same tensors through the same fallbacks."""
    from orkpy.formats.convert import dequantize_gguf
    import oracle
    llama_bin("llama-quantize")
    f32 = tmp_path / "gemma3-F32.gguf"
    dequantize_gguf(real_model("gemma3"), f32)
    out = tmp_path / "gemma3-Q4_K_M.gguf"
    log = oracle._run([llama_bin("llama-quantize"), f32, out, "Q4_K_M", 2])
    f32.unlink()
    tm, told = check_against_log(out, log)
    assert len(told) > 50  # rows of 640: most tensors fall back
    with pytest.warns(UserWarning, match=r"rows of 640 are not multiples of 256"):
        lit = orkpy.tier_map(out, fallback="literal")
    assert tm.int8_share() < lit.int8_share()
    shipped = orkpy.tier_map(real_model("gemma3"))
    assert {n: (e.ggml_type, e.intended) for n, e in shipped.fallbacks().items()} == \
        {n: (e.ggml_type, e.intended) for n, e in tm.fallbacks().items()}


@pytest.mark.slow
def test_inferred_types_equal_llama_quantize_log_on_synthetic_odd_rows(tmp_path):
    """Synthetic llama models with rows of 320 (32-blocks only) and 80 (not even 32: F16) quantized
    to Q4_K_M by the live llama-quantize."""
    from orkpy.evaluation.synthetic import make_synthetic
    llama_bin("llama-quantize")
    import oracle
    for n_embd, n_ff in ((320, 864), (80, 224)):
        p = make_synthetic(tmp_path / f"s{n_embd}", n_layer=8, n_embd=n_embd, n_ff=n_ff, n_head=4, n_head_kv=2)
        out = tmp_path / f"s{n_embd}-Q4_K_M.gguf"
        log = oracle._run([llama_bin("llama-quantize"), p["model"], out, "Q4_K_M", 2])
        tm, told = check_against_log(out, log)
        assert told, log[-2000:]
        if n_embd == 80:  # F16 substitutes keep the int8 tier (that file spends 16 bits on them)
            f16 = [n for n, (_, stored) in told.items() if stored == "F16"]
            assert f16 and all(tm[n] == "int8" for n in f16)
        else:
            assert all(tm[n] == "int4" for n, (want, _) in told.items() if want == "Q4_K")
