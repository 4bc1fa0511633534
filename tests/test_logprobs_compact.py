"""Compact reference log-probs (issue 12): uint16 codes on a square-root scale
below the exact top log-prob. The KL-mode figures computed from them equal the
float32 computation within a stated tolerance; the file is about half the
float32 size; version-1 (float32) files still read; bad files name the path."""
import os

import numpy as np
import pytest

import orkpy
from orkpy.cli import read_text_like_llama_cpp
from orkpy.evaluation.ppl import LP_RANGE, _log_softmax, decode_logprobs, encode_logprobs, tokens_for_ppl

N_CTX, CHUNKS = 256, 4
KL_ABS_TOL = 1e-5      # |mean KL (compact) - mean KL (float32)|, nats; measured ~3e-7 on stories260K


def test_encode_decode_error_bound(rng):
    logits = rng.standard_normal((64, 3000)) * 6
    logits[0, :5] = -np.inf                       # masked tokens
    logits[1] = 0.0                               # a flat row
    lp = _log_softmax(logits)
    codes, top, rng_, top_id = encode_logprobs(lp)
    assert codes.dtype == np.uint16 and np.array_equal(top_id, lp.argmax(1))
    back = decode_logprobs(codes, top, rng_)
    rows = np.arange(len(lp))
    assert np.array_equal(back[rows, top_id], lp[rows, top_id])          # the top log-prob is exact
    d = lp.max(1, keepdims=True) - lp
    R = rng_.astype(np.float64)[:, None]
    inside = d <= R
    bound = (2 * np.sqrt(np.minimum(d, R) / R) + 1 / 65535) * R / 131070   # the documented bound
    assert np.all(np.abs(back - lp)[inside] <= bound[inside] + 1e-12)
    assert np.all(np.abs(back - lp)[inside] < 1e-3)
    assert np.all(rng_ <= LP_RANGE) and np.any(~inside)                 # -inf and far tails: stored at the range
    assert np.all(back[~inside] == np.broadcast_to(lp.max(1, keepdims=True) - R, lp.shape)[~inside])


def _v1_file(ref, tokens, nll, path):
    """The reference as orkpy wrote it before (float32 log-probs over the whole vocabulary)."""
    lps = []
    first = N_CTX // 2
    for c in range(CHUNKS):
        chunk = tokens[c * N_CTX:(c + 1) * N_CTX].copy()
        chunk[0] = ref.tokenizer.bos_id
        lp = _log_softmax(ref.forward(chunk, first=first)[:-1])
        lps.append(lp.astype(np.float32))
    np.savez(path, logprobs=np.concatenate(lps), nll=nll, tokens=tokens[:CHUNKS * N_CTX],
             n_ctx=N_CTX)


def test_compact_kl_equals_float32(shared, tmp_path):
    st = shared / "models" / "stories260K"
    text = read_text_like_llama_cpp(shared / "text" / "tinystories-val-B.txt")
    ref = orkpy.load_model(st / "stories260K-F32.gguf")
    v2, v1 = tmp_path / "ref.npz", tmp_path / "ref-v1.npz"
    r0 = orkpy.perplexity(ref, text, n_ctx=N_CTX, chunks=CHUNKS, progress=False, save_logprobs=str(v2))
    assert [p.name for p in tmp_path.iterdir()] == ["ref.npz"]   # no temp file left
    with np.load(v2) as z:
        _v1_file(ref, tokens_for_ppl(ref, text), z["nll"], v1)   # the same per-token NLLs as before
        assert int(z["version"]) == 2 and z["lp_codes"].dtype == np.uint16 and "logprobs" not in z.files
        assert len(z["tokens"]) == CHUNKS * N_CTX
    # 2 bytes per vocabulary entry + 24 per token (+ the scored tokens) against 4 per entry: ~half at 512 entries
    assert os.path.getsize(v2) <= 0.52 * os.path.getsize(v1)
    for tag in ("Q4_0", "Q8_0"):
        m = orkpy.load_model(st / f"stories260K-{tag}.gguf")
        a = orkpy.perplexity(m, text, n_ctx=N_CTX, chunks=CHUNKS, progress=False, kld_base=str(v1)).kld
        b = orkpy.perplexity(m, text, n_ctx=N_CTX, chunks=CHUNKS, progress=False, kld_base=str(v2)).kld
        assert abs(b["mean"] - a["mean"]) <= KL_ABS_TOL, tag
        assert abs(b["p99"] - a["p99"]) <= 1e-4 and abs(b["median"] - a["median"]) <= 1e-4
        assert b["same_top"] == a["same_top"]
        assert b["delta_ppl"] == pytest.approx(a["delta_ppl"], abs=1e-9)
        assert b["ppl_base"] == pytest.approx(r0.ppl, rel=1e-12)
    same = orkpy.perplexity(ref, text, n_ctx=N_CTX, chunks=CHUNKS, progress=False, kld_base=str(v2)).kld
    assert abs(same["mean"]) <= KL_ABS_TOL and same["same_top"] == 1.0 and same["delta_ppl"] == 0.0


def test_bad_reference_files_name_the_path(shared, tmp_path):
    st = shared / "models" / "stories260K"
    m = orkpy.load_model(st / "stories260K-F32.gguf")
    text = read_text_like_llama_cpp(shared / "text" / "tinystories-val-B.txt")
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(os.urandom(1000))
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, something=np.zeros(3))
    future = tmp_path / "future.npz"
    np.savez(future, version=99, nll=np.zeros(1), tokens=np.zeros(1, np.int32), n_ctx=N_CTX)
    for path, what in ((garbage, "not an orkpy reference"), (wrong, "not an orkpy reference"),
                       (future, "version 99")):
        with pytest.raises(ValueError, match=what) as e:
            orkpy.perplexity(m, text, n_ctx=N_CTX, chunks=2, progress=False, kld_base=str(path))
        assert str(path) in str(e.value)
