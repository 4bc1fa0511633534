"""Compact reference log-probs (issue 12): uint16 codes on a square-root scale
below the exact top log-prob. The KL-mode figures computed from them equal the
float32 computation within a stated tolerance; the file is about half the
float32 size; version-1 (float32) files still read; bad files name the path."""
import os

import numpy as np
import pytest

import orkpy
from orkpy import FormatError
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


# ------------------------------------------------- a tampered reference (attack campaign) --
# Every field of the file is checked against what perplexity(save_logprobs=) writes; before, only
# shapes, tokens, n_ctx and the vocabulary size were: a range of 1e30 gave a smaller mean KL (a gate
# could pass on it), a NaN range KL nan, the top log-prob +5 a KL of 2692, nll cut to 3 entries a
# wrong base PPL, a top id past the vocabulary same-top 0; a 2-element n_ctx / version let a
# TypeError escape and a length-1 lp_top array a raw NumPy IndexError naming no file.

def _row0(a, v):
    a = a.copy()
    a[0] = v
    return a


def _top_elsewhere(z):
    t = z["top_id"].copy()
    t[0] = (t[0] + 1) % z["lp_codes"].shape[1]
    return t


def _codes_second_top(z):
    c = z["lp_codes"].copy()
    c[0, (int(z["top_id"][0]) + 1) % c.shape[1]] = 0      # a second token as likely as the top
    return c


def _nll_far(z, v):
    """nll v on a row whose scored token is coded at the range (more than 64 nats below the top)."""
    first = N_CTX // 2
    tg = z["tokens"].reshape(-1, N_CTX)[:, first + 1:].reshape(-1)
    nll, codes, top, rng = z["nll"].copy(), z["lp_codes"].copy(), z["lp_top"].copy(), z["lp_range"].copy()
    codes[0, tg[0]] = 65535     # a consistent far row: the scored token at the range, the range 64
    rng[0] = 64.0
    top[0] = 0.0
    codes[0, np.arange(codes.shape[1]) != z["top_id"][0]] = 65535
    nll[0] = v
    z.update(lp_codes=codes, lp_top=top, lp_range=rng)
    return nll


def _halve_row0(a):
    a = a.astype(np.float32).copy()
    a[0] /= 2
    return a


TAMPER = {   # name: (field(s) the error must name, {member: new value or f(z) -> value}, members to drop)
    "range 1e30": ("lp_range", {"lp_range": lambda z: _row0(z["lp_range"], 1e30)}),
    "range nan": ("lp_range", {"lp_range": lambda z: _row0(z["lp_range"], np.nan)}),
    "range negative": ("lp_range", {"lp_range": lambda z: _row0(z["lp_range"], -5.0)}),
    "range 0": ("lp_range", {"lp_range": lambda z: _row0(z["lp_range"], 0.0)}),
    "range beyond 64": ("lp_range", {"lp_range": lambda z: _row0(z["lp_range"], 100.0)}),
    "range halved": ("lp_range'", {"lp_range": lambda z: _halve_row0(z["lp_range"])}),
    "range float32 inf": ("lp_range", {"lp_range": lambda z: _row0(z["lp_range"], np.inf)}),
    "top +5": ("lp_top", {"lp_top": lambda z: z["lp_top"] + 5}),
    "top -1 (not normalised)": ("lp_top'", {"lp_top": lambda z: _row0(z["lp_top"], z["lp_top"][0] - 1)}),
    "top nan": ("lp_top", {"lp_top": lambda z: _row0(z["lp_top"], np.nan)}),
    "top length 1": ("lp_top", {"lp_top": lambda z: z["lp_top"][:1]}),
    "top 2-D": ("lp_top", {"lp_top": lambda z: z["lp_top"][:, None]}),
    "nll cut to 3": ("nll", {"nll": lambda z: z["nll"][:3]}),
    "nll nan": ("nll", {"nll": lambda z: _row0(z["nll"], np.nan)}),
    "nll negative": ("nll", {"nll": lambda z: _row0(z["nll"], -1.0)}),
    "nll scaled": ("nll", {"nll": lambda z: z["nll"] * 0.8}),
    "nll 1e300 on a far token": ("nll", {"nll": lambda z: _nll_far(z, 1e300)}),
    "nll 800 on a far token (base PPL overflows)": ("nll", {"nll": lambda z: _nll_far(z, 800.0 * 127)}),
    "nll int": ("nll", {"nll": lambda z: z["nll"].astype(np.int64)}),
    "top id past the vocabulary": ("top_id", {"top_id": lambda z: _row0(z["top_id"], z["lp_codes"].shape[1])}),
    "top id negative": ("top_id", {"top_id": lambda z: _row0(z["top_id"], -1)}),
    "top id not the top": ("top_id", {"top_id": _top_elsewhere}),
    "top id float": ("top_id", {"top_id": lambda z: z["top_id"].astype(np.float64)}),
    "codes: a second top": ("lp_codes'", {"lp_codes": _codes_second_top}),
    "codes int32": ("lp_codes", {"lp_codes": lambda z: z["lp_codes"].astype(np.int32)}),
    "codes one row short": ("lp_codes", {"lp_codes": lambda z: z["lp_codes"][:-1]}),
    "n_ctx 2 elements": ("n_ctx", {"n_ctx": np.array([N_CTX, N_CTX])}),
    "n_ctx float": ("n_ctx", {"n_ctx": np.float64(N_CTX)}),
    "n_ctx odd": ("n_ctx", {"n_ctx": np.int64(N_CTX + 1)}),
    "n_ctx 10**18": ("n_ctx", {"n_ctx": np.int64(10 ** 18)}),
    "version 2 elements": ("version", {"version": np.array([2, 2])}),
    "version float": ("version", {"version": np.float64(2.0)}),
    "version bool": ("version", {"version": np.bool_(True)}),
    "tokens cut": ("tokens", {"tokens": lambda z: z["tokens"][:-1]}),
    "tokens past the vocabulary": ("tokens", {"tokens": lambda z: _row0(z["tokens"], z["lp_codes"].shape[1])}),
    "tokens 2-D": ("tokens", {"tokens": lambda z: z["tokens"].reshape(CHUNKS_T, -1)}),
    "tokens float": ("tokens", {"tokens": lambda z: z["tokens"].astype(np.float32)}),
    "no lp_top": ("lp_top", {}, ("lp_top",)),
    "an extra member": ("extra", {"extra": np.zeros(2)}),
}
CHUNKS_T = 2


@pytest.fixture(scope="module")
def genuine(shared, tmp_path_factory):
    st = shared / "models" / "stories260K"
    text = read_text_like_llama_cpp(shared / "text" / "tinystories-val-B.txt")
    m = orkpy.load_model(st / "stories260K-F32.gguf")
    p = tmp_path_factory.mktemp("ref") / "ref.npz"
    orkpy.perplexity(m, text, n_ctx=N_CTX, chunks=CHUNKS_T, progress=False, save_logprobs=str(p))
    with np.load(p) as z:
        arrays = {k: z[k] for k in z.files}
    return m, text, p, arrays


def _kl(m, text, path):
    return orkpy.perplexity(m, text, n_ctx=N_CTX, chunks=CHUNKS_T, progress=False, kld_base=str(path))


@pytest.mark.parametrize("case", sorted(TAMPER))
def test_tampered_reference_is_a_format_error_naming_file_and_field(genuine, tmp_path, case):
    m, text, _, arrays = genuine
    field, changes, *drop = TAMPER[case]
    z = dict(arrays)
    for k, v in changes.items():
        z[k] = v(z) if callable(v) else v
    for k in (drop[0] if drop else ()):
        del z[k]
    p = tmp_path / "bad.npz"
    np.savez(p, **z)
    with pytest.raises(FormatError) as e:
        _kl(m, text, p)
    msg = str(e.value)
    assert type(e.value) is FormatError and str(p) in msg
    assert (f"'{field}'" if not field.endswith("'") else field) in msg, msg


def test_genuine_reference_still_reads(genuine):
    m, text, p, _ = genuine
    kld = _kl(m, text, p).kld
    assert abs(kld["mean"]) <= KL_ABS_TOL and kld["same_top"] == 1.0 and kld["delta_ppl"] == 0.0


def _npz_raw(members):
    """An .npz written by hand: {name: (header dict, data bytes)}."""
    import io
    import zipfile
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, (header, data) in members.items():
            h = io.BytesIO()
            np.lib.format.write_array_header_1_0(h, header)
            zf.writestr(name + ".npy", h.getvalue() + data)
    return buf.getvalue()


@pytest.mark.parametrize("how", ["huge shape", "shape beyond the data", "object dtype", "structured dtype",
                                 "not npy", "truncated zip", "crc"])
def test_reference_container_is_checked_before_reading(genuine, tmp_path, how):
    """An .npy header claiming 10^12 elements must be refused from the member's size, not allocated;
    any damage to the container is a FormatError naming the file."""
    m, text, good, _ = genuine
    p = tmp_path / "bad.npz"
    f8 = {"descr": "<f8", "fortran_order": False}
    if how == "huge shape":
        p.write_bytes(_npz_raw({"nll": (dict(f8, shape=(10 ** 12,)), bytes(8))}))
    elif how == "shape beyond the data":
        p.write_bytes(_npz_raw({"nll": (dict(f8, shape=(4,)), bytes(8))}))
    elif how == "object dtype":
        p.write_bytes(_npz_raw({"nll": ({"descr": "|O", "fortran_order": False, "shape": (1,)}, bytes(8))}))
    elif how == "structured dtype":
        p.write_bytes(_npz_raw({"nll": ({"descr": [("a", "<f8")], "fortran_order": False, "shape": (1,)}, bytes(8))}))
    elif how == "not npy":
        import zipfile
        with zipfile.ZipFile(p, "w") as zf:
            zf.writestr("nll.npy", b"hello")
    elif how == "truncated zip":
        p.write_bytes(good.read_bytes()[:-100])
    else:
        raw = bytearray(good.read_bytes())
        raw[200] ^= 1     # inside the first member's data: its CRC no longer matches
        p.write_bytes(bytes(raw))
    with pytest.raises(FormatError) as e:
        _kl(m, text, p)
    assert str(p) in str(e.value)


def test_tampered_v1_reference_is_a_format_error(genuine, tmp_path):
    """Version 1 (float32 log-probs): non-finite or positive log-probs, rows that are no
    distribution and NLLs that disagree with them are refused too."""
    m, text, _, arrays = genuine
    tokens = arrays["tokens"]
    lp = np.concatenate([_log_softmax(m.forward(np.r_[m.tokenizer.bos_id, tokens[c * N_CTX + 1:(c + 1) * N_CTX]],
                                                first=N_CTX // 2)[:-1]) for c in range(CHUNKS_T)]).astype(np.float32)
    base = dict(logprobs=lp, nll=arrays["nll"], tokens=arrays["tokens"], n_ctx=N_CTX)
    ok = tmp_path / "v1.npz"
    np.savez(ok, **base)
    assert abs(_kl(m, text, ok).kld["mean"]) <= KL_ABS_TOL
    for what, change in (("logprobs", dict(logprobs=_row0(lp, np.nan))), ("logprobs", dict(logprobs=lp + 1)),
                         ("logprobs", dict(logprobs=lp - 1)), ("nll", dict(nll=arrays["nll"] + 0.5)),
                         ("nll", dict(nll=arrays["nll"][:5]))):
        p = tmp_path / "bad-v1.npz"
        np.savez(p, **dict(base, **change))
        with pytest.raises(FormatError, match=f"field '{what}'"):
            _kl(m, text, p)
