"""The live llama.cpp oracle itself (tests/oracle.py, .ci/llama-oracle, .ci/fetch-models):
it must be there in CI, agree with the facts recorded in ../shared/README.md, and give float
logits orkpy's float forward pass matches on stories260K."""
import hashlib

import numpy as np
import pytest

import orkpy
from oracle import (MODELS, llama_bin, llama_imatrix, llama_kld, llama_perplexity, llama_quantize, oracle_logits,
                    oracle_tokens, real_model)

SHA256 = {"smollm2": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
          "gemma3": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"}


@pytest.mark.parametrize("tool", ["llama-perplexity", "llama-imatrix", "llama-tokenize", "llama-quantize",
                                  "ork-oracle"])
def test_oracle_tools_are_built(tool):
    assert llama_bin(tool).stat().st_size > 0


@pytest.mark.parametrize("name", sorted(MODELS))
def test_real_models_are_the_published_files(name):
    h = hashlib.sha256()
    with open(real_model(name), "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    assert h.hexdigest() == SHA256[name]


def test_oracle_tokens_match_the_recorded_llama_tokenize_figures(shared):
    # ../shared/README.md: 199,091 tokens, first ids 1 410 454 425 356 261 419
    ids = oracle_tokens(shared / "models/stories260K/stories260K-F32.gguf", shared / "text/tinystories-val-B.txt")
    assert len(ids) == 199091 and ids[:7].tolist() == [1, 410, 454, 425, 356, 261, 419]
    ids = oracle_tokens(shared / "models/qwen3-skeleton/qwen3-skel-tied-F16.gguf", shared / "text/tinystories-val-B.txt")
    assert len(ids) == 102988 and ids[:7].tolist() == [2043, 415, 327, 274, 725, 268, 547]


def test_oracle_logits_match_orkpy_float_forward_on_stories260k(shared):
    path = shared / "models/stories260K/stories260K-F32.gguf"
    toks = oracle_tokens(path, shared / "text/tinystories-val-B.txt")[:512]
    ref = oracle_logits(path, toks, n_ctx=256, first=0)
    assert ref.shape == (2, 256, 512)
    m = orkpy.load_model(path)
    for c in range(2):
        got = m.forward(toks[c * 256:(c + 1) * 256])
        assert np.abs(got - ref[c]).max() < 1e-4 * np.abs(ref[c]).max()
    # and it is a real comparison: a one-token change moves llama.cpp's logits
    toks2 = toks.copy()
    toks2[10] = (toks2[10] + 1) % 512
    assert np.abs(oracle_logits(path, toks2[:256], n_ctx=256)[0, 10:] - ref[0, 10:]).max() > 1e-2


@pytest.mark.slow
def test_llama_quantize_imatrix_and_kl_mode_on_stories260k(shared, tmp_path):
    f32 = shared / "models/stories260K/stories260K-F32.gguf"
    text = shared / "text/tinystories-val-B.txt"
    base = llama_kld(f32, tmp_path / "base.kld", text, n_ctx=256, chunks=2)
    assert base["ppl"] == pytest.approx(llama_perplexity(f32, text, 256, 2)["ppl"], rel=1e-4)
    im = llama_imatrix(f32, shared / "text/wikitext-2-raw-test.txt", 256, 2, tmp_path / "im.gguf")
    q8 = llama_quantize(f32, tmp_path / "q8.gguf", "Q8_0")
    q4 = llama_quantize(f32, tmp_path / "q4.gguf", "Q4_K_M", imatrix=im)
    assert im.stat().st_size > 0 and q4.stat().st_size < q8.stat().st_size < f32.stat().st_size
    same, r8, r4 = (llama_kld(m, tmp_path / "base.kld", n_ctx=256) for m in (f32, q8, q4))
    assert same["kld"] < 1e-5 and same["ppl"] == pytest.approx(base["ppl"], rel=1e-4)
    for r in (r8, r4):
        assert r["ppl_base"] == pytest.approx(base["ppl"], rel=1e-4) and 0.5 < r["same_top"] <= 1
    assert 1e-5 < r8["kld"] < r4["kld"] < 0.1
