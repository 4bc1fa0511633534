"""GPTQ rounding (orkpy.quantization.gptq; the C core csrc/ork/gptq.h against the NumPy reference
tests/gptq_ref.py) and the input Gram matrices the forward pass collects for it
(csrc/ork/linear.h, "Input Gram matrix"). Both against contract oracles in C, natively and on aarch64
under qemu: tests/c/test_gptq.c."""
import json

import numpy as np
import pytest

import orkpy
from orkpy import _core
from orkpy.quantization.gptq import collect_grams, gptq_linears, gptq_quantize
from orkpy.runtime.model import LinearSpec, Model, linear_names
from orkpy.kernels.quant import QuantizedTensor
from orkpy.formats.source import open_source
from orkpy.evaluation.testing import synthetic_forward_model

import archgen
from gptq_ref import gptq_ref


def correlated_gram(rng, K, rows=3000):
    x = rng.standard_normal((rows, K)) @ rng.standard_normal((K, K)) * 0.2 + rng.standard_normal((rows, K))
    x[:, :3] *= 20  # a few outlier channels
    return x.T @ x


def out_err(w, qt, g):
    d = w.astype(np.float64) - orkpy.dequantize(qt).astype(np.float64)
    return float(np.einsum("nk,kj,nj->", d, g, d))


def naive_gptq(w, g, damp, qmax=127):
    """The textbook column loop (no lazy blocks): round column k like quantize(), push its error
    (w_k - q_k s) / U[k, k] onto the later columns through U's row k, U = chol(inv(G + damp))^T.
    qmax: the 8-bit kind's code range (127 int8, 31 int6, 15 int5)."""
    w = w.astype(np.float64).copy()
    K = w.shape[1]
    h = g + damp * np.mean(np.diag(g)) * np.eye(K)
    u = np.linalg.cholesky(np.linalg.inv(h)).T
    amax = np.abs(w).max(1).astype(np.float32)
    s, inv = (amax / np.float32(qmax)).astype(np.float64), np.float32(qmax) / amax
    q = np.empty(w.shape, np.int8)
    for k in range(K):
        y = w[:, k].astype(np.float32) * inv
        qk = np.clip(np.trunc(y + np.copysign(np.float32(0.5), y)), -qmax, qmax)
        q[:, k] = qk
        e = (w[:, k] - qk * s) / u[k, k]
        w[:, k + 1:] -= np.outer(e, u[k, k + 1:])
    return q


def test_diagonal_gram_without_damping_is_plain_rounding(rng):
    w = rng.standard_normal((40, 96)).astype(np.float32)
    w[3] = 0.0  # a zero row
    g = np.diag(rng.uniform(0.5, 2.0, 96))
    g[7, 7] = 0.0  # a channel that never fired
    q, p = gptq_quantize(w, g, damp=0.0), orkpy.quantize(w, "int8")
    assert q.kind == "int8" and q.shape == (40, 96) and q.lut is None
    assert np.array_equal(q.codes, p.codes) and np.array_equal(q.scales, p.scales)


def test_gptq_lowers_the_output_error_and_keeps_the_format(rng):
    K = 160
    w = rng.standard_normal((48, K)).astype(np.float32)
    g = correlated_gram(rng, K)
    q, p = gptq_quantize(w, g), orkpy.quantize(w, "int8")
    assert np.array_equal(q.scales, p.scales)  # plain rounding's per-row scale
    assert q.codes.dtype == np.int8 and q.codes.min() >= -127
    assert out_err(w, q, g) < 0.75 * out_err(w, p, g)  # measured 0.57-0.60
    pw = orkpy.pack(q)
    x = rng.standard_normal((3, K)).astype(np.float32)
    assert np.array_equal(pw.dequantize(), orkpy.dequantize(q))
    assert pw.matmul(x).shape == (3, 48)


@pytest.mark.parametrize("kind", ["nf4", "int4"])
def test_four_bit_gptq(rng, kind):
    """4-bit kinds: a diagonal Gram without damping is plain nearest-level rounding (bit-identical
    codes and scales); on correlated inputs the output error drops below plain rounding with the
    same importance (the Gram diagonal); the tensor packs and runs like any 4-bit one."""
    K = 160
    w = rng.standard_normal((48, K)).astype(np.float32)
    w[5] = 0.0
    q, p = gptq_quantize(w, np.diag(rng.uniform(0.5, 2.0, K)), kind, damp=0.0), orkpy.quantize(w, kind)
    assert q.kind == kind and np.array_equal(q.codes, p.codes) and np.array_equal(q.scales, p.scales)
    g = correlated_gram(rng, K)
    rows = 1000
    q = gptq_quantize(w, g, kind, rows=rows)
    plain = orkpy.quantize(w, kind, imatrix=np.diag(g) / rows)
    assert np.array_equal(q.scales, plain.scales) and np.array_equal(q.lut, plain.lut)
    assert out_err(w, q, g) < 0.9 * out_err(w, plain, g)
    pw = orkpy.pack(q)
    assert np.array_equal(pw.dequantize(), orkpy.dequantize(q))


@pytest.mark.parametrize("block", [1, 7, 128, 1000])
def test_lazy_blocks_follow_the_textbook_column_loop(rng, block):
    K = 96
    w = rng.standard_normal((32, K)).astype(np.float32)
    g = correlated_gram(rng, K)
    ref = naive_gptq(w, g, 0.01)
    q = gptq_quantize(w, g, damp=0.01, block=block)
    # the same arithmetic up to the order of the float64 updates: a rounding tie may flip
    assert np.mean(q.codes != ref) < 2e-3
    assert np.abs(q.codes.astype(int) - ref).max() <= 1


@pytest.mark.parametrize("kind, qmax", [("int6", 31), ("int5", 15)])
def test_int6_int5_follow_the_textbook_loop_and_beat_rounding(rng, kind, qmax):
    K = 96
    w = rng.standard_normal((32, K)).astype(np.float32)
    g = correlated_gram(rng, K)
    ref = naive_gptq(w, g, 0.01, qmax)
    q, p = gptq_quantize(w, g, kind, damp=0.01, block=32), orkpy.quantize(w, kind)
    assert q.kind == kind and np.abs(q.codes).max() <= qmax and np.array_equal(q.scales, p.scales)
    assert np.mean(q.codes != ref) < 2e-3 and np.abs(q.codes.astype(int) - ref).max() <= 1
    assert out_err(w, q, g) < 0.8 * out_err(w, p, g)


@pytest.mark.parametrize("kw, msg", [
    (dict(kind="q4_0"), "unknown kind 'q4_0'"),
    (dict(damp=-1.0), "damp"),
    (dict(block=0), "block"),
    (dict(gram=np.eye(5)), r"must be \(8, 8\)"),
    (dict(gram=np.full((8, 8), np.nan)), "non-finite"),
    (dict(gram=-np.eye(8)), "negative diagonal"),
    (dict(gram=np.zeros((8, 8)) + np.eye(8) - 2 * np.eye(8, k=1) - 2 * np.eye(8, k=-1), damp=0.0), "positive definite"),
])
def test_bad_arguments_name_the_weight(rng, kw, msg):
    args = dict(w=rng.standard_normal((4, 8)).astype(np.float32), gram=np.eye(8))
    args.update(kw)
    with pytest.raises(ValueError, match=msg) as e:
        gptq_quantize(where="blk.3.attn_q.weight", **args)
    assert "blk.3.attn_q.weight" in str(e.value)


# ------------------------------------------------------ C core vs reference --
def nibbles(codes):
    return np.stack([codes & 15, codes >> 4], -1).reshape(codes.shape[0], -1)


def agreement(kind, a, b):
    """Share of equal codes (4-bit: per nibble)."""
    return float(np.mean(a == b) if orkpy.kernels.quant.KIND_INFO[kind].bits == 8 else np.mean(nibbles(a) == nibbles(b)))


def hard_case(rng, N=40, K=201):
    """A weight with a zero row and a Gram matrix with outlier channels and two dead columns."""
    w = rng.standard_normal((N, K)).astype(np.float32)
    w[3] = 0.0
    g = correlated_gram(rng, K)
    g[[5, 100], :] = 0.0
    g[:, [5, 100]] = 0.0
    return w, g


def close_to_reference(kind, q, ref_codes, ref_scales, w, g):
    """The margins of the C core against the NumPy reference (LAPACK and BLAS round differently
    from the C factorization and updates): >= 99% of the codes equal and the output error
    tr(dW G dW^T) within 1% of the reference's. Measured on hard_case (6 seeds x every kind and
    grouping below) and on a K = 384 Gram of 200 rows with damp 0.001: 100% equal, error
    ratio exactly 1; the reference with its error feedback disabled: 54-72% equal, error 46-63%
    below -- so a broken feedback fails both margins."""
    r = QuantizedTensor(kind=kind, shape=q.shape, codes=ref_codes, scales=ref_scales, lut=q.lut, group=q.group)
    return agreement(kind, q.codes, ref_codes) >= 0.99 and abs(out_err(w, q, g) / out_err(w, r, g) - 1) <= 0.01


GROUPINGS = [(None, False), (32, False), (64, False), (32, True), (64, True)]


@pytest.mark.parametrize("kind", ["int8", "nf4", "int4", "int6", "int5"])
@pytest.mark.parametrize("group, static", GROUPINGS)
def test_c_core_matches_the_numpy_reference(rng, kind, group, static):
    """Random weights and Gram matrices, K = 201 (odd, not a multiple of the 128-column block nor
    of the groups), a zero row, dead columns, per channel and group 32 / 64, dynamic and static
    groups: the C core is within the margins of tests/gptq_ref.py, the scales are the
    reference's (quantize()'s, float16 when grouped), and the reference with its error
    feedback disabled (a broken implementation) fails the margins."""
    w, g = hard_case(rng)
    rows = 3000 if kind != "int8" else 0
    q = gptq_quantize(w, g, kind, rows=rows, group_size=group, static_groups=static)
    rc, rs = gptq_ref(w, g, kind, rows=rows, group_size=group, static_groups=static)
    assert close_to_reference(kind, q, rc, rs, w, g)
    if static or group is None:  # chosen before any update: the reference's exactly
        assert np.array_equal(q.scales, rs)
    if group:
        assert np.array_equal(q.scales.astype(np.float16).astype(np.float32), q.scales)  # float16 values
    bc, bs = gptq_ref(w, g, kind, rows=rows, group_size=group, static_groups=static, disable_feedback=True)
    assert not close_to_reference(kind, q, bc, bs, w, g)
    assert np.array_equal(orkpy.pack(q).dequantize(), orkpy.dequantize(q))


@pytest.mark.parametrize("kind", ["int8", "nf4"])
def test_threads_and_block_never_change_the_bytes(rng, kind):
    """Rows run in blocks of 16 on any number of threads and the lazy updates apply the eager
    loop's subtractions in the same order: threads 1 / 2 and block 1 / 7 / 128 / 1000 give
    identical codes and scales (dynamic groups of 32 whose groups straddle the blocks included)."""
    w, g = hard_case(rng, N=70, K=150)
    for group in (None, 32):
        runs = [gptq_quantize(w, g, kind, rows=3000, block=b, threads=t, group_size=group)
                for b, t in ((128, 1), (128, 2), (1, 2), (7, 1), (1000, 2))]
        for r in runs[1:]:
            assert np.array_equal(r.codes, runs[0].codes) and np.array_equal(r.scales, runs[0].scales)


@pytest.mark.parametrize("kind,group", [("int8", None), ("nf4", 32), ("int4", None)])
def test_overwrite_gram_is_the_workspace_and_changes_nothing_else(rng, kind, group):
    """overwrite_gram=True: the C core factors in the caller's Gram matrix (its contents are
    gone afterwards: one K x K float64 matrix less in memory) and gives the same codes and
    scales as a run on an untouched Gram matrix; a read-only Gram matrix is left alone."""
    w, g = hard_case(rng, N=40, K=150)
    want = gptq_quantize(w, g, kind, rows=3000, group_size=group)
    g2 = g.copy()
    got = gptq_quantize(w, g2, kind, rows=3000, group_size=group, overwrite_gram=True)
    assert np.array_equal(got.codes, want.codes) and np.array_equal(got.scales, want.scales)
    assert not np.array_equal(g2, g)
    ro = g.copy()
    ro.flags.writeable = False
    got = gptq_quantize(w, ro, kind, rows=3000, group_size=group, overwrite_gram=True)
    assert np.array_equal(got.codes, want.codes) and np.array_equal(ro, g)


@pytest.mark.parametrize("kind,group", [("int8", None), ("nf4", 32), ("int4", None)])
def test_float32_precision(rng, kind, group):
    """precision="float32" (gptq.h "Precision"): its own arithmetic (codes differ from float64's
    somewhere), the same quality (output error within 2 % of float64's), independent of block and
    threads, the same bytes with overwrite_gram (U in the Gram matrix's memory); an unknown
    precision is refused, naming the weight."""
    w, g = hard_case(rng, N=40, K=150)
    d64 = gptq_quantize(w, g, kind, rows=3000, group_size=group)
    runs = [gptq_quantize(w, g, kind, rows=3000, group_size=group, block=b, threads=t, precision="float32")
            for b, t in ((128, 1), (1, 2), (7, 2))]
    for r in runs[1:]:
        assert np.array_equal(r.codes, runs[0].codes) and np.array_equal(r.scales, runs[0].scales)
    e32, e64 = out_err(w, runs[0], g), out_err(w, d64, g)
    assert abs(e32 - e64) <= 0.02 * e64, (e32, e64)
    g2 = g.copy()
    got = gptq_quantize(w, g2, kind, rows=3000, group_size=group, overwrite_gram=True, precision="float32")
    assert np.array_equal(got.codes, runs[0].codes) and np.array_equal(got.scales, runs[0].scales)
    assert not np.array_equal(g2, g)
    with pytest.raises(ValueError, match="blk.0.ffn_down.weight: precision must be one of"):
        gptq_quantize(w, g, kind, where="blk.0.ffn_down.weight", precision="float16")


def test_float32_precision_differs_somewhere(rng):
    """The float32 path is really taken: at K = 1024 some codes differ from float64's (measured:
    229 of 262,144 int8 codes at N = 256; small K rarely moves one)."""
    K = 1024
    x = rng.standard_normal((2 * K, K)).astype(np.float32)
    x[:, ::7] *= 5
    g = x.T.astype(np.float64) @ x
    w = (rng.standard_normal((128, K)) * 0.05).astype(np.float32)
    a = gptq_quantize(w, g, "int8")
    b = gptq_quantize(w, g, "int8", precision="float32")
    assert not np.array_equal(a.codes, b.codes)
    assert abs(out_err(w, a, g) - out_err(w, b, g)) <= 1e-3 * out_err(w, a, g)


def test_quantize_model_gptq_precision(shared, tmp_path):
    """quantize_model(gptq_precision="float32") rounds every GPTQ linear in float32 (the layer-by-layer
    run passes the recipe's precision to the C core) and records it in the manifest's settings."""
    path = shared / STORIES
    calib = halves(shared)[0]
    kw = dict(calib=calib, calib_ctx=256, calib_chunks=2, method="gptq", progress=False, log=lambda s: None)
    q64 = orkpy.quantize_model(path, path, **kw)
    q32 = orkpy.quantize_model(path, path, gptq_precision="float32", **kw)
    assert q32.settings["gptq"]["precision"] == "float32" and "precision" not in q64.settings["gptq"]
    assert q32.recipe.rounding.gptq_precision == "float32"
    assert any(not np.array_equal(q32.tensors[n].int8_weight(), q64.tensors[n].int8_weight()) for n in q64.tensors)
    with pytest.raises(orkpy.RecipeError, match="rounding.gptq_precision"):
        orkpy.quantize_model(path, path, calib=calib, gptq_precision="float32", progress=False, log=lambda s: None)


@pytest.mark.parametrize("K", [1, 2, 63, 64, 65, 200])
def test_factor_is_the_cholesky_factor_of_the_inverse(rng, K):
    """_core.gptq_factor(h) = U with inv(h) = U^T U, U upper: LAPACK's cholesky(inv(h)).T to
    rounding (measured <= 2e-15 of max |U|), bit-identical for 1 and 2 threads, across the
    64-wide panels of the blocked factorization."""
    x = rng.standard_normal((2 * K + 3, K))
    h = x.T @ x + 0.1 * np.eye(K)
    u = _core.gptq_factor(h, threads=1)
    ref = np.linalg.cholesky(np.linalg.inv(h)).T
    assert np.array_equal(u, np.triu(u)) and np.all(np.diag(u) > 0)
    assert np.abs(u - ref).max() <= 1e-13 * np.abs(ref).max()
    assert np.array_equal(u, _core.gptq_factor(h, threads=2))
    with pytest.raises(ValueError, match="not positive definite"):
        _core.gptq_factor(-h)


def test_non_finite_weight_and_bad_rows_name_the_weight(rng):
    w = rng.standard_normal((4, 8)).astype(np.float32)
    w[2, 5] = np.nan
    with pytest.raises(ValueError, match=r"blk\.1\.ffn_up\.weight: weight has a non-finite value \(NaN\) at \[2, 5\]"):
        gptq_quantize(w, np.eye(8), where="blk.1.ffn_up.weight")
    with pytest.raises(ValueError, match=r"w: rows must be an int >= 0"):
        gptq_quantize(np.ones((4, 8), np.float32), np.eye(8), "nf4", where="w", rows=-1)
    g = np.eye(8)
    g[3, 4] = np.inf
    with pytest.raises(ValueError, match=r"non-finite value at \(3, 4\)"):
        gptq_quantize(np.ones((4, 8), np.float32), g)
    big = np.ones((4, 64), np.float32)
    big[1, 40] = 1e7  # group 1's float16 scale would overflow (its scale is chosen when the loop gets there)
    with pytest.raises(ValueError, match=r"blk\.2\.attn_q\.weight: weight row 1, group 1 \(columns 32\.\.63\) .*float16"):
        gptq_quantize(big, np.eye(64), "int8", group_size=32, where="blk.2.attn_q.weight")
    assert gptq_quantize(big, np.eye(64), "int8").scales[1] == np.float32(1e7) / 127  # per row: float32


# ------------------------------------------------------------ Gram matrices --
def tiny_forward():
    return synthetic_forward_model(n_layer=2, n_embd=64, n_ff=96, n_head=2, n_head_kv=1, head_dim=32, n_vocab=50)


def test_gram_is_symmetric_per_linear_with_its_row_count():
    fwd = tiny_forward()
    tokens = np.arange(1, 41, dtype=np.int32)
    fwd.gram_enable([0, 6, 14])  # blk.0.attn_q, blk.0.ffn_down, the head
    fwd.forward(tokens, 30)
    got = fwd.gram_take()
    assert sorted(got) == [0, 6, 14]
    (g, rows), (gd, rows_d), (gh, rows_h) = got[0], got[6], got[14]
    assert rows == rows_d == 40 and rows_h == 10  # the head sees the rows from `first` on
    assert g.shape == (64, 64) and gd.shape == (96, 96) and gh.shape == (64, 64)
    for m in (g, gd, gh):
        assert np.array_equal(m, m.T)
        assert np.linalg.eigvalsh(m).min() > -1e-6 * np.abs(m).max()
    with pytest.raises(RuntimeError, match="not enabled"):
        fwd.gram_take()


def test_gram_diagonal_is_the_imatrix_and_threads_change_nothing():
    """The Gram matrix's diagonal is the imatrix's sum of squares (the imatrix in double; the Gram
    matrix float32 within blocks of 256 rows, csrc/ork/linear.h: equal to float32 rounding), and
    no thread count changes a bit of it."""
    fwd = tiny_forward()
    tokens = np.arange(3, 35, dtype=np.int32)
    n = len(linear_names({"n_layer": 2}))
    res = []
    for threads in (1, 2):
        fwd.imatrix_enable()
        fwd.gram_enable(range(n))
        fwd.forward(tokens, 0, threads)
        im, gr = fwd.imatrix_take(), fwd.gram_take()
        for i, (sums, count) in enumerate(im):
            np.testing.assert_allclose(np.diag(gr[i][0]), sums, rtol=2e-6, atol=0)
            assert gr[i][1] == count
        res.append(gr)
    for i in range(n):
        assert np.array_equal(res[0][i][0], res[1][i][0])


def test_gram_enable_refuses_bad_indices():
    fwd = tiny_forward()
    with pytest.raises(ValueError, match="outside"):
        fwd.gram_enable([15])
    with pytest.raises(TypeError):
        fwd.gram_enable(3)


# --------------------------------------------------------------- real model --
STORIES = "models/stories260K/stories260K-F32.gguf"


def halves(shared):
    text = (shared / "text" / "tinystories-val-B.txt").read_text(encoding="utf-8")
    cut = text.index("\n", len(text) // 2) + 1
    return text[:cut], text[cut:]


def test_gram_matches_numpy_on_the_first_linear_of_stories260k(shared):
    src = open_source(shared / STORIES)
    m = orkpy.load_model(shared / STORIES)
    tokens = m.tokens("Once upon a time there was a little dog.")
    grams = m.collect_grams([tokens], ["blk.0.attn_q.weight", "blk.0.attn_k.weight"])
    x = src.tensor("token_embd.weight")[tokens].astype(np.float64)
    h = x / np.sqrt((x * x).mean(1, keepdims=True) + src.hp["norm_eps"]) * src.tensor("blk.0.attn_norm.weight")
    g, rows = grams["blk.0.attn_q.weight"]
    assert rows == len(tokens)
    np.testing.assert_allclose(g, h.T @ h, rtol=1e-5, atol=1e-5 * np.abs(g).max())
    assert np.array_equal(grams["blk.0.attn_k.weight"][0], g)  # the same input, accumulated the same way
    with pytest.raises(ValueError, match="no linear named 'blk.9.attn_q.weight'"):
        m.collect_grams([tokens], ["blk.9.attn_q.weight"])
    shared_in = collect_grams(m, [tokens], ["blk.0.attn_v.weight", "blk.0.ffn_up.weight"])
    assert np.array_equal(shared_in["blk.0.attn_v.weight"][0], g)  # k/v share q's matrix


@pytest.mark.slow
def test_gptq_lowers_weight_only_kl_on_stories260k(shared, tmp_path):
    """Measured (4 x 256 tokens of the held-out half, calibration 4 x 256 of the other): int8 weight-only
    mean KL 0.000545 plain, 0.000470 GPTQ; each linear's output error on the calibration text lower."""
    path = shared / STORIES
    calib, scored = halves(shared)
    src = open_source(path)
    names = linear_names(src.hp)
    gq = gptq_linears(src, calib, n_ctx=256, chunks=4, progress=False, max_bytes=64 << 10)  # several passes
    assert set(gq) == set(names)
    base = orkpy.load_model(path)
    grams = collect_grams(base, base.chunks(base.tokens(calib), 256, 4)[1], names)
    worse = [n for n in names
             if out_err(src.linear(n), gq[n], grams[n][0]) > out_err(src.linear(n), orkpy.quantize(src.linear(n), "int8"),
                                                                   grams[n][0])]
    assert not worse, worse
    toks = base.tokens(scored)
    ref = tmp_path / "ref.npz"
    orkpy.perplexity(base, toks, n_ctx=256, chunks=4, save_logprobs=ref, progress=False)

    def kl(qts):
        lin = {n: LinearSpec.f32(n, orkpy.dequantize(qts[n])) for n in names}
        m = Model(str(path), src.hp, lin, src.tensor, src.meta, src.tied, {n: "int8" for n in names})
        return orkpy.perplexity(m, toks, n_ctx=256, chunks=4, kld_base=ref, progress=False).kld["mean"]

    plain = kl({n: orkpy.quantize(src.linear(n), "int8") for n in names})
    assert kl(gq) < 0.93 * plain


def test_sequential_calibrates_each_layer_on_the_quantized_layers_before_it(tmp_path, monkeypatch):
    """sequential=True: one pass per layer, collecting only that layer's Gram matrices, on the
    model cut after it (layers before it holding their GPTQ weights), the head's on the whole
    quantized model. Layer 0 sees the float model's inputs (the same bytes as the one-pass
    result); every later layer's bytes are those of gptq_quantize on Gram matrices collected by
    the full float model with the earlier layers swapped for their dequantized GPTQ weights."""
    from orkpy.quantization import gptq
    from orkpy.runtime.model import float_model
    p = tmp_path / "q.gguf"
    archgen.make("qwen3", p, n_layer=3)
    src = open_source(p)
    calib = archgen.tokens(256, seed=3)
    passes = []
    real = gptq.collect_grams

    def counted(m, it, names, threads=None):
        passes.append((m.hparams["n_layer"], list(names)))
        return real(m, it, names, threads)
    monkeypatch.setattr(gptq, "collect_grams", counted)
    kw = dict(n_ctx=64, chunks=2, progress=False)
    seq = gptq_linears(src, calib, "nf4", sequential=True, **kw)
    names = linear_names(src.hp)
    layer = [[n for n in names if n.startswith(f"blk.{i}.")] for i in range(3)]
    assert passes == [(1, layer[0]), (2, layer[1]), (3, layer[2]), (3, ["output.weight"])]
    passes.clear()
    one = gptq_linears(src, calib, "nf4", **kw)
    assert len(passes) == 1 and set(one) == set(seq) == set(names)
    assert all(np.array_equal(seq[n].codes, one[n].codes) for n in layer[0])
    assert not all(np.array_equal(seq[n].codes, one[n].codes) for n in layer[1] + layer[2])
    m = float_model(src)
    toks = m.tokens(calib)
    for i, grp in enumerate(layer[1:] + [["output.weight"]], start=1):
        for n in layer[i - 1]:
            m.swap_linear(n, LinearSpec.f32(n, seq[n].dequantize()))
        grams = real(m, m.chunks(toks, 64, 2)[1], grp)
        for n in grp:
            q = gptq_quantize(src.linear(n), grams[n][0], "nf4", rows=grams[n][1])
            assert np.array_equal(q.codes, seq[n].codes) and np.array_equal(q.scales, seq[n].scales), n


def test_quantize_model_gptq_rounds_the_int8_tier_and_saves_so(shared, tmp_path):
    path = shared / STORIES  # an F32 GGUF as its own allocation: every linear in the int8 tier
    calib, scored = halves(shared)
    quiet = dict(progress=False, log=lambda s: None)
    with pytest.raises(ValueError, match="needs calib"):
        orkpy.quantize_model(path, path, method="gptq", **quiet)
    with pytest.raises(ValueError, match="exclude each other"):
        orkpy.quantize_model(path, path, method="gptq", sr=True, calib=calib, **quiet)
    qm = orkpy.quantize_model(path, path, calib=calib, calib_ctx=256, calib_chunks=4, method="gptq", **quiet)
    plain = orkpy.quantize_model(path, path, **quiet)
    direct = gptq_linears(open_source(path), calib, n_ctx=256, chunks=4, progress=False)
    assert set(qm.tensors) == set(direct) and all(t == "int8" for t in qm.tiers.values())
    for n, pw in qm.tensors.items():
        assert np.array_equal(pw.int8_weight(), direct[n].codes) and np.array_equal(pw.bscale, direct[n].scales)
    assert any(not np.array_equal(pw.int8_weight(), plain.tensors[n].int8_weight()) for n, pw in qm.tensors.items())
    assert qm.settings["gptq"] == {"damp": 0.01, "block": 128, "n_ctx": 256, "chunks": 4}
    assert plain.settings["gptq"] is None
    back = orkpy.load_model(qm.save(tmp_path / "m"))
    ids = back.tokens(scored[:400])
    assert np.array_equal(back.forward(ids), qm.to_model().forward(ids))


def test_quantize_model_gptq_sequential(shared, tmp_path):
    """quantize_model(gptq_sequential=True) rounds with gptq_linears(sequential=True) and records it."""
    path = shared / STORIES
    calib = halves(shared)[0]
    qm = orkpy.quantize_model(path, path, calib=calib, calib_ctx=256, calib_chunks=2, method="gptq",
                              gptq_sequential=True, progress=False, log=lambda s: None)
    direct = gptq_linears(open_source(path), calib, n_ctx=256, chunks=2, progress=False, sequential=True)
    for n, pw in qm.tensors.items():
        assert np.array_equal(pw.int8_weight(), direct[n].codes) and np.array_equal(pw.bscale, direct[n].scales)
    assert qm.settings["gptq"] == {"damp": 0.01, "block": 128, "n_ctx": 256, "chunks": 2, "sequential": True}


@pytest.mark.slow
def test_accuracy_bench_gptq_sequential_rows(tmp_path):
    """bench/accuracy.py --gptq-sequential: each gptq row again as 'gptq+seq' (same bytes, its own KL)."""
    from conftest import load_bench
    acc = load_bench("accuracy")
    acc.main(["--model", "stories260k", "--chunks", "1", "--calib-chunks", "2", "--ctx", "256", "--methods", "gptq",
              "--groups", "0", "--target-methods", "--no-int8", "--no-llama", "--gptq-sequential",
              "--work", str(tmp_path), "--json-out", str(tmp_path / "{model}.json")])
    rows = {r["what"]: r for r in json.loads((tmp_path / "stories260k.json").read_text())["rows"]}
    assert sorted(rows) == ["nf4 gptq w-only", "nf4 gptq w4a8", "nf4 gptq+seq w-only", "nf4 gptq+seq w4a8"]
    assert rows["nf4 gptq+seq w4a8"]["bytes"] == rows["nf4 gptq w4a8"]["bytes"]
    assert 0 < rows["nf4 gptq+seq w4a8"]["kld"] != rows["nf4 gptq w4a8"]["kld"]


@pytest.mark.slow
def test_act_modes_bench_selects_gptq(shared, tmp_path):
    from conftest import load_bench
    act_modes = load_bench("act_modes")
    act_modes.main(["--model", "stories260k", "--chunks", "1", "--calib-chunks", "2", "--ctx", "256", "--weights", "int8",
                    "--gptq", "int8", "--imatrix", "--rotate", "none", "--prefix", "1", "--outliers", "8", "--no-llama",
                    "--work", str(tmp_path), "--json-out", str(tmp_path / "{model}.json")])
    rows = {(r["weights"], r["act"]): r for r in json.loads((tmp_path / "stories260k.json").read_text())["rows"]}
    assert 0 < rows[("int8+gptq", "weight-only")]["kld"] < rows[("int8+gptq", "per_token")]["kld"]
    assert ("int8", "weight-only") not in rows  # --gptq int8 replaces plain rounding of the int8 rows


def test_quantize_cli_method_gptq(shared, tmp_path):
    from orkpy.cli import main
    calib = tmp_path / "calib.txt"
    calib.write_text(halves(shared)[0], encoding="utf-8")
    out = tmp_path / "gq"
    assert main(["quantize", str(shared / STORIES), "--alloc", str(shared / STORIES), "--method", "gptq",
                 "--calib", str(calib), "--calib-ctx", "256", "--calib-chunks", "2", "-o", str(out),
                 "--no-progress"]) == 0
    assert json.loads((out / "manifest.json").read_text())["settings"]["gptq"]["chunks"] == 2
    assert "sequential" not in json.loads((out / "manifest.json").read_text())["settings"]["gptq"]
    seq = tmp_path / "gs"
    assert main(["quantize", str(shared / STORIES), "--alloc", str(shared / STORIES), "--method", "gptq",
                 "--gptq-sequential", "--calib", str(calib), "--calib-ctx", "256", "--calib-chunks", "2", "-o",
                 str(seq), "--no-progress"]) == 0
    assert json.loads((seq / "manifest.json").read_text())["settings"]["gptq"]["sequential"] is True
    assert main(["quantize", str(shared / STORIES), "--alloc", str(shared / STORIES), "--gptq-sequential",
                 "--calib", str(calib), "-o", str(tmp_path / "y"), "--no-progress"]) == 1  # rtn: a named error
    assert main(["quantize", str(shared / STORIES), "--alloc", str(shared / STORIES), "--method", "gptq",
                 "-o", str(tmp_path / "x"), "--no-progress"]) == 1   # no --calib: a ValueError, named
    with pytest.raises(ValueError):
        orkpy.quantize_model(shared / STORIES, shared / STORIES, method="awq")


@pytest.mark.slow
@pytest.mark.gate
def test_quantize_model_gptq_beats_rtn_imatrix_on_the_4bit_tier(shared, tmp_path):
    """A mixed allocation (stories260K's Q4_0 file: int4 tier nf4, ffn_down int8): method='gptq'
    rounds both tiers, the 4-bit scales from the imatrix clip search with the Gram diagonal, and
    beats plain rounding with orkpy's imatrix of the same calibration text (w4a8 per token, KL vs
    F32 on the held-out half)."""
    path, alloc = shared / STORIES, shared / "models/stories260K/stories260K-Q4_0.gguf"
    calib, scored = halves(shared)
    quiet = dict(progress=False, log=lambda s: None)
    base = orkpy.load_model(path)
    im = orkpy.collect_imatrix(base, calib, n_ctx=256, chunks=8, progress=False)
    rtn = orkpy.quantize_model(path, alloc, imatrix=im, **quiet)
    gq = orkpy.quantize_model(path, alloc, method="gptq", calib=calib, calib_ctx=256, calib_chunks=8, **quiet)
    four = [n for n, t in gq.tiers.items() if t == "int4"]
    assert four and any(t == "int8" for t in gq.tiers.values())
    assert all(gq.tensors[n].kind == "nf4" for n in four)
    toks = base.tokens(scored)
    ref = tmp_path / "ref.npz"
    orkpy.perplexity(base, toks, n_ctx=256, chunks=8, save_logprobs=ref, progress=False)

    def kl(qm, d):
        m = orkpy.load_model(qm.save(tmp_path / d))
        return orkpy.perplexity(m, toks, n_ctx=256, chunks=8, kld_base=ref, progress=False).kld["mean"]

    k_rtn, k_gq = kl(rtn, "rtn"), kl(gq, "gptq")
    print(f"stories260K w4a8 mean KL: RTN + imatrix {k_rtn:.5f}, GPTQ {k_gq:.5f}")
    assert k_gq < 0.9 * k_rtn
