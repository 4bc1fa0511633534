"""Accuracy gates: orkpy's perplexity against llama.cpp's llama-perplexity
figures on stories260K (../shared/README.md), n_ctx 256, the whole
tinystories-val-B text (777 chunks, 127 scored tokens each). Marker: gate."""
import json
import math

import numpy as np
import pytest

import orkpy
from orkpy.cli import main, read_text_like_llama_cpp

pytestmark = pytest.mark.gate

# llama-perplexity -c 256 on text/tinystories-val-B.txt: (PPL, +/-)
LLAMA_CPP = {"F32": (5.5642, 0.04196), "F16": (5.5639, 0.04196), "Q8_0": (5.5732, 0.04207),
             "Q4_K_M": (5.6726, 0.04303), "Q4_0": (6.0680, 0.04591)}
TOL = {"F32": 0.001, "F16": 0.001, "Q8_0": 0.005, "Q4_K_M": 0.005, "Q4_0": 0.005}


@pytest.fixture(scope="module")
def text(shared):
    return read_text_like_llama_cpp(shared / "text" / "tinystories-val-B.txt")


@pytest.fixture(scope="module")
def tokens(shared, text):
    return orkpy.load_model(shared / "models/stories260K/stories260K-F32.gguf").tokenizer.encode(text)


def test_tokens_as_llama_perplexity_reads_the_file(tokens):
    assert len(tokens) == 199090 and tokens[0] == 1


@pytest.mark.parametrize("name", ["F32", "F16", "Q8_0", "Q4_K_M", "Q4_0"])
def test_ppl_matches_llama_cpp(shared, tokens, name):
    m = orkpy.load_model(shared / f"models/stories260K/stories260K-{name}.gguf", weights="gguf")
    r = orkpy.perplexity(m, tokens, n_ctx=256, progress=False)
    ref, ref_err = LLAMA_CPP[name]
    print(f"\n{name}: orkpy {r.ppl:.4f} +/- {r.ppl_err:.5f}, llama.cpp {ref:.4f} +/- {ref_err:.5f}, "
          f"rel diff {r.ppl / ref - 1:+.5f}, {r.wall_time:.1f} s")
    assert r.chunks == 777 and r.scored == 777 * 127 and r.n_tokens == 199090
    assert abs(r.ppl / ref - 1) < TOL[name]
    assert abs(r.ppl_err / ref_err - 1) < 0.02


def test_ppl_first_20_chunks(shared, text):
    m = orkpy.load_model(shared / "models/stories260K/stories260K-F32.gguf")
    r = orkpy.perplexity(m, text, n_ctx=256, chunks=20, progress=False)
    assert r.chunks == 20 and r.scored == 20 * 127
    assert abs(r.ppl / 6.8239 - 1) < 0.001 and abs(r.ppl_err / 0.41717 - 1) < 0.02
    assert json.loads(r.to_json())["ppl"] == r.ppl
    assert r.chunk_ppl[-1] == pytest.approx(r.ppl)


def test_kl_divergence_mode(shared, tokens, tmp_path):
    base = tmp_path / "f32-logprobs.npz"
    f32 = orkpy.load_model(shared / "models/stories260K/stories260K-F32.gguf")
    r0 = orkpy.perplexity(f32, tokens, n_ctx=256, chunks=20, progress=False, save_logprobs=base)
    same = orkpy.perplexity(f32, tokens, n_ctx=256, chunks=20, progress=False, kld_base=base)
    assert same.kld["mean"] == pytest.approx(0, abs=1e-6) and same.kld["same_top"] == 1.0
    q8 = orkpy.perplexity(orkpy.load_model(shared / "models/stories260K/stories260K-Q8_0.gguf"), tokens,
                          n_ctx=256, chunks=20, progress=False, kld_base=base)
    q4 = orkpy.perplexity(orkpy.load_model(shared / "models/stories260K/stories260K-Q4_0.gguf"), tokens,
                          n_ctx=256, chunks=20, progress=False, kld_base=base)
    print(f"\nKLD vs F32 (20 chunks): Q8_0 {q8.kld['mean']:.6f} same-top {q8.kld['same_top']:.4f}; "
          f"Q4_0 {q4.kld['mean']:.6f} same-top {q4.kld['same_top']:.4f}")
    assert 0 < q8.kld["mean"] < q4.kld["mean"] < 1.0
    assert q8.kld["same_top"] > 0.95 > q4.kld["same_top"] > 0.7
    assert q8.kld["ppl_base"] == pytest.approx(r0.ppl) and q8.kld["delta_ppl"] == pytest.approx(q8.ppl - r0.ppl)


def test_cli_ppl_json(shared, tmp_path, capsys):
    rc = main(["ppl", str(shared / "models/stories260K/stories260K-F32.gguf"),
               str(shared / "text/tinystories-val-B.txt"), "--ctx", "256", "--chunks", "20", "--json", "--no-progress"])
    assert rc == 0
    r = json.loads(capsys.readouterr().out)
    assert abs(r["ppl"] / 6.8239 - 1) < 0.001 and r["config"]["model"] == "stories260K-F32.gguf"


def test_ppl_bad_input(shared, tokens):
    m = orkpy.load_model(shared / "models/stories260K/stories260K-F32.gguf")
    with pytest.raises(ValueError, match="at least"):
        orkpy.perplexity(m, tokens[:300], n_ctx=256, progress=False)
    with pytest.raises(ValueError, match="n_ctx"):
        orkpy.perplexity(m, tokens, n_ctx=255, progress=False)
    with pytest.raises(TypeError, match="token ids"):
        orkpy.perplexity(m, np.ones((2, 2), np.int32), progress=False)
