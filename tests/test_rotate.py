"""Rotations folded into the weights and SmoothQuant migration (orkpy/runtime/rotate.py, issue 16 item 1).

- The Hadamard constructions (Paley I/II x Sylvester) are exact for the residual widths of the
  models (64, 576 SmolLM2, 640 Gemma 3, 896, 1536, 2048); other orders get a random orthogonal
  matrix, said so.
- A rotated and/or smoothed model computes the same function in float: the synthetic model of
  every rotatable architecture (tests/archgen.py: outliers, biases on every linear, a tied head,
  fused tensors, q/k norms) against the float64 reference of the *original* weights, stories260K
  and SmolLM2 (the real model) against their unrotated forward pass. Gemma 2/3 refuse the
  residual fold (post norms); their block inputs are rotated online after the norms, exactly.
- On SmolLM2 the rotated residual stream has no outlier channels, and w8a8 (int8 weights,
  per-token int8 activations) loses less than half the KL vs F32 it loses unrotated.
- quantize_model saves the transformed tensors; the manifest records how; reloading runs them.
"""
import json

import numpy as np
import pytest

import orkpy
from orkpy import _core
from orkpy.runtime.rotate import TransformedSource, hadamard, hadamard_factors, rotate_source, rotation
from orkpy.runtime.model import transformed_source
from orkpy.formats.source import open_source
from orkpy.formats.tiermap import tier_map

import archgen

REL = 5e-4  # max |logit diff| / std(reference logits), as tests/test_arch.py holds the forward pass

CASES = {
    "llama-all-biases": dict(arch="llama", qkv_bias=True, ffn_bias=True),
    "llama-48-wide": dict(arch="llama", D=48, H=4, HKV=2, F=80),  # Paley 12 x 4 residual, Paley 12 heads
    "qwen2-tied-output-bias": dict(arch="qwen2", tied=True, output_bias=True),
    "qwen3": dict(arch="qwen3", hd=24),
    "phi3-fused": dict(arch="phi3", qkv_bias=True),
}


def _make(tmp_path, case):
    kw = dict(CASES[case]) if case in CASES else {"arch": case}
    a = kw.pop("arch")
    p = tmp_path / f"{case}.gguf"
    T, c = archgen.make(a, p, **kw)
    return p, T, c


@pytest.mark.parametrize("n", [1, 2, 4, 8, 12, 20, 24, 36, 48, 64, 576, 640, 896, 1536, 2048])
def test_hadamard_orders(n):
    h = hadamard(n)
    assert h is not None and set(np.unique(h)) <= {-1.0, 1.0}
    np.testing.assert_array_equal(h @ h.T, n * np.eye(n))
    q, how = rotation(n, "hadamard", seed=3)
    np.testing.assert_allclose(q @ q.T, np.eye(n), atol=1e-12)
    assert how.startswith("randomized Hadamard")


def test_hadamard_factors_of_the_model_widths():
    assert hadamard_factors(576) == (36, 16)   # SmolLM2: Paley II (q = 17) x Sylvester 16
    assert hadamard_factors(640) == (20, 32)   # Gemma 3: Paley I (q = 19) x Sylvester 32
    assert hadamard_factors(1536) == (12, 128)
    assert hadamard_factors(64) == (1, 64)


@pytest.mark.parametrize("n", [3, 6, 10, 92])  # 92: a Hadamard order (Williamson) not built here
def test_orders_without_hadamard_get_a_random_orthogonal_matrix(n):
    assert hadamard(n) is None
    q, how = rotation(n, "hadamard", seed=1)
    assert "random orthogonal" in how and "no Hadamard" in how
    np.testing.assert_allclose(q @ q.T, np.eye(n), atol=1e-12)
    np.testing.assert_array_equal(q, rotation(n, "hadamard", seed=1)[0])   # seeded
    assert not np.array_equal(q, rotation(n, "hadamard", seed=2)[0])


def test_rotation_is_seeded_and_checked():
    a, b = rotation(64, seed=5)[0], rotation(64, seed=6)[0]
    np.testing.assert_array_equal(a, rotation(64, seed=5)[0])
    assert not np.array_equal(a, b)
    with pytest.raises(ValueError, match="rotate must be one of"):
        rotation(64, "givens")


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("how", ["rotate", "smooth", "both", "orthogonal", "online", "rotate+online+smooth"])
def test_transformed_model_computes_the_same_function(tmp_path, case, how):
    """The rotated / smoothed C forward pass against the float64 reference of the original weights."""
    p, T, c = _make(tmp_path, case)
    tok = archgen.tokens(64)
    kw = {"rotate": dict(rotate="hadamard"), "orthogonal": dict(rotate="orthogonal", rotate_seed=4),
          "smooth": dict(smooth=0.5), "both": dict(rotate="hadamard", smooth=0.6),
          "online": dict(rotate_online=True, rotate_seed=1),
          "rotate+online+smooth": dict(rotate="hadamard", rotate_online=True, smooth=0.5)}[how]
    if "smooth" in kw:
        kw.update(calib=archgen.tokens(128, seed=7), calib_ctx=64, calib_chunks=2)
    m = orkpy.load_model(p, **kw)
    diff, rel, kl = archgen.compare(m.forward(tok), archgen.ref_forward(T, c, tok))
    assert rel < REL, (case, how, diff, rel, kl)
    plain = orkpy.load_model(p)
    # the weights did change: every linear (rotated) or the smoothed groups
    changed = [n for n in m.linear_names() if not np.array_equal(m.linears[n].weight, plain.linears[n].weight)]
    assert len(changed) == len(m.linear_names()) if "rotate" in kw else len(changed) > 0
    if c["tied"] and how != "online":
        assert plain.tied and not m.tied  # the head E diag(g) Q is not the embedding E Q any more
    assert bool(m.hparams.get("ffn_down_rot")) == ("online" in how)
    if "online" in how:  # ffn_down's weight expects its input rotated online: only that gives the reference
        down = "blk.0.ffn_down.weight"
        assert not np.array_equal(m.linears[down].weight, plain.linears[down].weight)


def test_rotation_folds_norms_and_biases_as_documented(tmp_path):
    p, T, c = _make(tmp_path, "llama-all-biases")
    src = open_source(p)
    rs = rotate_source(src, "hadamard", seed=0, heads=False)
    q, _ = rotation(c["D"], "hadamard", seed=0)
    for name in ("blk.0.attn_norm.weight", "blk.1.ffn_norm.weight", "output_norm.weight"):
        np.testing.assert_array_equal(rs.tensor(name), np.ones(c["D"], np.float32))
        assert rs.type_of(name) == "F32"
    g = T["blk.0.attn_norm.weight"].astype(np.float64)
    np.testing.assert_allclose(rs.tensor("blk.0.attn_k.weight"), (T["blk.0.attn_k.weight"] * g) @ q, rtol=1e-6,
                               atol=1e-6)
    np.testing.assert_allclose(rs.tensor("blk.0.ffn_down.weight"), q.T @ T["blk.0.ffn_down.weight"], rtol=1e-6,
                               atol=1e-6)
    np.testing.assert_allclose(rs.tensor("blk.0.ffn_down.bias"), T["blk.0.ffn_down.bias"] @ q, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(rs.tensor("blk.0.attn_q.bias"), T["blk.0.attn_q.bias"])  # input side: unchanged
    np.testing.assert_allclose(rs.tensor("token_embd.weight"), T["token_embd.weight"] @ q, rtol=1e-6, atol=1e-5)
    assert not rs.transformed("blk.0.attn_q.bias") and rs.transformed("blk.0.attn_output.bias")


@pytest.mark.parametrize("arch_name", ["gemma", "gemma2", "gemma3"])
def test_gemma_rotates_its_block_inputs_online_and_smooths_exactly(tmp_path, arch_name):
    """Gemma 2/3's post norms keep a rotation out of the residual stream, and Gemma 1's head must
    stay tied (a fold unties it): the residual fold is refused, and the default placement rotates
    the outputs of attn_norm / ffn_norm online (the input linears folded, V/O per head offline),
    which computes the same function."""
    p, T, c = _make(tmp_path, arch_name)
    src = open_source(p)
    why = "unties its head" if arch_name == "gemma" else "post_attention_norm"
    with pytest.raises(NotImplementedError, match=f"{why}.*placement='online'"):
        rotate_source(src, "hadamard", placement="fold")
    tok = archgen.tokens(64)
    ref = archgen.ref_forward(T, c, tok)
    plain = orkpy.load_model(p)
    for kw in (dict(rotate="hadamard"), dict(rotate="hadamard", rotate_online=True, rotate_seed=3),
               dict(rotate="hadamard", smooth=0.5, calib=archgen.tokens(128, seed=7), calib_ctx=64, calib_chunks=2)):
        m = orkpy.load_model(p, **kw)
        diff, rel, kl = archgen.compare(m.forward(tok), ref)
        assert rel < REL, (arch_name, kw, diff, rel)
        assert m.hparams["norm_rot"] and m.tied == plain.tied  # the head and the embedding are untouched
        changed = {n for n in m.linear_names() if not np.array_equal(m.linears[n].weight, plain.linears[n].weight)}
        assert {"blk.0.attn_q.weight", "blk.0.attn_v.weight", "blk.0.attn_output.weight",
                "blk.0.ffn_up.weight"} <= changed
    rs = rotate_source(src, "hadamard", seed=0)
    assert rs.info()["placement"] == "online" and rs.info()["construction"] == "Hadamard 64 = Sylvester 64"
    g = T["blk.1.ffn_norm.weight"].astype(np.float64)
    signs, h = rs._nrot
    np.testing.assert_allclose(rs.tensor("blk.1.ffn_norm.weight"), g * signs, rtol=1e-6)  # signs ride on the norm
    np.testing.assert_allclose(rs.tensor("blk.1.ffn_gate.weight"), (T["blk.1.ffn_gate.weight"] * signs) @ h,
                               rtol=1e-5, atol=1e-6)
    m = orkpy.load_model(p, smooth=0.5, calib=archgen.tokens(128, seed=7), calib_ctx=64, calib_chunks=2)
    diff, rel, kl = archgen.compare(m.forward(tok), ref)
    assert rel < REL, (arch_name, diff, rel)
    assert m.tied == (arch_name in ("gemma", "gemma2"))  # their head is always the embedding: not smoothed
    m = orkpy.load_model(p, rotate_online=True)  # inside the FFN, before the post norm: exact
    diff, rel, kl = archgen.compare(m.forward(tok), ref)
    assert rel < REL and m.hparams["ffn_down_rot"], (arch_name, diff, rel)


@pytest.mark.parametrize("case", ["llama-48-wide", "qwen3"])
def test_online_placement_is_exact_on_pre_norm_models_too(tmp_path, case):
    p, T, c = _make(tmp_path, case)
    tok = archgen.tokens(64)
    m = orkpy.load_model(p, rotate="hadamard", rotate_placement="online")
    diff, rel, kl = archgen.compare(m.forward(tok), archgen.ref_forward(T, c, tok))
    assert rel < REL and m.hparams["norm_rot"], (case, diff, rel)
    with pytest.raises(ValueError, match="placement must be"):
        orkpy.load_model(p, rotate="hadamard", rotate_placement="residual")


@pytest.mark.parametrize("arch_name", ["gemma", "gemma3"])
def test_online_placement_round_trip(tmp_path, arch_name):
    """The default placement saved and reloaded (Gemma 1: a fold would untie the head, and its
    float.gguf, holding an output.weight, would not load)."""
    p, T, c = _make(tmp_path, arch_name)
    qm = orkpy.quantize_model(p, tier_map(p), rotate="hadamard", progress=False, log=lambda m: None)
    assert qm.settings["transform"]["placement"] == "online"
    m = orkpy.load_model(qm.save(tmp_path / "q"))
    assert m.hparams["norm_rot"]  # re-applied from the manifest: the saved input linears expect it
    tok = archgen.tokens(64)
    np.testing.assert_array_equal(m.forward(tok), qm.to_model().forward(tok))
    ref = archgen.ref_forward(T, c, tok)
    assert archgen.compare(m.forward(tok), ref)[2] < 0.05


def test_stories260k_rotated_float_outputs(shared):
    path = shared / "models" / "stories260K" / "stories260K-F32.gguf"
    tok = np.arange(3, 259)
    a = orkpy.load_model(path).forward(tok)
    b = orkpy.load_model(path, rotate="hadamard", rotate_seed=9).forward(tok)
    assert np.abs(a - b).max() < REL * a.std()


def test_argument_errors(tmp_path, shared):
    p, _, _ = _make(tmp_path, "qwen3")
    with pytest.raises(ValueError, match="smooth= needs calib="):
        orkpy.load_model(p, smooth=0.5)
    with pytest.raises(ValueError, match="alpha in"):
        orkpy.load_model(p, smooth=1.5, calib=archgen.tokens(128), calib_ctx=64)
    with pytest.raises(ValueError, match="rotate must be one of"):
        orkpy.load_model(p, rotate="yes")
    src = open_source(p)
    with pytest.raises(ValueError, match="needs stats="):
        rotate_source(src, "hadamard", smooth=0.5)
    with pytest.raises(ValueError, match="already transformed"):
        rotate_source(rotate_source(src), "hadamard")
    assert rotate_source(src, None) is src
    d = shared / "models" / "stories260K"
    qm = orkpy.quantize_model(d / "stories260K-F16.gguf", d / "stories260K-Q4_0.gguf", rotate="hadamard",
                              progress=False, log=lambda m: None)
    out = qm.save(tmp_path / "q")
    with pytest.raises(ValueError, match="quantized model directory"):
        orkpy.load_model(out, rotate="hadamard")


def test_online_rotation_round_trip_and_refusals(tmp_path, shared):
    p, T, c = _make(tmp_path, "llama-48-wide")  # n_ff 80 = Paley 20 x Sylvester 4
    qm = orkpy.quantize_model(p, tier_map(p), rotate="hadamard", rotate_online=True, progress=False,
                              log=lambda m: None)
    assert qm.settings["rotate_online"] and qm.settings["transform"]["online_construction"] == \
        "Hadamard 80 = Paley 20 x Sylvester 4"
    out = qm.save(tmp_path / "q")
    m = orkpy.load_model(out)
    assert m.hparams["ffn_down_rot"]  # re-applied from the manifest: the saved ffn_down expects it
    tok = archgen.tokens(64)
    np.testing.assert_array_equal(m.forward(tok), qm.to_model().forward(tok))
    ref = archgen.ref_forward(T, c, tok)
    assert archgen.compare(m.forward(tok), ref)[2] < archgen.compare(
        orkpy.load_model(p, weights="int8").forward(tok), ref)[2]  # int8 KL: rotated below plain here too
    from orkpy.evaluation import ffn
    st = ffn.prep(m, archgen.tokens(256), n_ctx=64, chunks=2)
    with pytest.raises(ValueError, match="rotated online"):
        m.set_ffn(0, ffn.layer_params(st[0], "fused"))
    m._fwd.set_ffn(0, ffn.layer_params(st[0], "fused"))  # past the Python check, the C model refuses it
    with pytest.raises(ValueError, match="does not apply the online down rotation"):
        m.forward(tok)
    with pytest.raises(ValueError, match="n_ff = 172"):  # stories260K: 172 = 4 x 43, no Hadamard built
        orkpy.load_model(shared / "models" / "stories260K" / "stories260K-F32.gguf", rotate_online=True)


def test_quantize_model_saves_the_rotated_model(tmp_path, shared):
    d = shared / "models" / "stories260K"
    text = (shared / "text" / "tinystories-val-B.txt").read_text(encoding="utf-8")
    calib = text[200_000:260_000]
    tok = np.arange(3, 131)
    kw = dict(rotate="hadamard", rotate_seed=2, smooth=0.5, calib=calib, calib_ctx=128, calib_chunks=2)
    qm = orkpy.quantize_model(d / "stories260K-F16.gguf", d / "stories260K-Q4_0.gguf", progress=False,
                              log=lambda m: None, **kw)
    plain = orkpy.quantize_model(d / "stories260K-F16.gguf", d / "stories260K-Q4_0.gguf", progress=False,
                                 log=lambda m: None)
    assert qm.tiers == plain.tiers  # the tier map applies by tensor name
    out = qm.save(tmp_path / "q")
    man = json.loads((tmp_path / "q" / "manifest.json").read_text())
    s = man["settings"]
    assert (s["rotate"], s["rotate_seed"], s["smooth"]) == ("hadamard", 2, 0.5)
    assert s["transform"]["construction"] == "randomized Hadamard 64 = Sylvester 64"
    assert s["transform"]["calib"]["chunks"] == 2 and s["transform"]["calib"]["n_ctx"] == 128
    m = orkpy.load_model(out)
    np.testing.assert_array_equal(m.forward(tok), qm.to_model().forward(tok))  # saved already transformed
    ts = transformed_source(open_source(d / "stories260K-F16.gguf"), **kw)
    assert isinstance(ts, TransformedSource) and ts.info() == s["transform"]
    g = orkpy.GGUFFile(str(tmp_path / "q" / "float.gguf"))
    for name in ("token_embd.weight", "blk.0.attn_norm.weight", "output_norm.weight"):  # rotated, 1 / s
        np.testing.assert_array_equal(g.tensor(name), ts.tensor(name))
        assert g.tensor_info(name).type == "F32"  # transformed values are not rounded to the source's fp16
    assert plain.settings["rotate"] is None and plain.settings["transform"] is None
    assert not np.array_equal(m.forward(tok), plain.to_model().forward(tok))


def test_rotated_tied_head_kept_float_is_saved_as_output_weight(tmp_path):
    p, T, c = _make(tmp_path, "qwen2-tied-output-bias")
    tm = tier_map(p, embeddings="float")  # tied: the head follows the embedding's tier
    qm = orkpy.quantize_model(p, tm, rotate="hadamard", progress=False, log=lambda m: None)
    assert qm.tiers["output.weight"] == "float" and qm.float_linears() == {"output.weight": "output.weight"}
    out = qm.save(tmp_path / "q")
    g = orkpy.GGUFFile(str(tmp_path / "q" / "float.gguf"))
    assert "output.weight" in g  # E diag(g) Q, not the embedding
    m = orkpy.load_model(out)
    assert not m.tied
    tok = archgen.tokens(64)
    np.testing.assert_array_equal(m.forward(tok), qm.to_model().forward(tok))
    np.testing.assert_array_equal(m.linears["output.weight"].weight, qm.to_model().linears["output.weight"].weight)


def _smollm2_rotated_float_equivalence(f32, text):
    ids = orkpy.load_model(f32).tokens(text[:20_000])[:256]
    a = orkpy.load_model(f32).forward(ids)
    b = orkpy.load_model(f32, rotate="hadamard").forward(ids)
    return np.abs(a - b).max() / a.std()


@pytest.mark.slow
def test_smollm2_rotation(shared, tmp_path):
    """The real model: float outputs kept (measured 3e-5 x std), outlier channels gone from the
    residual stream (per-channel RMS max / mean of the q/k/v and gate/up inputs: 7.2 to 56 per
    layer unrotated, 1.5 to 2.3 rotated), and w8a8 mean KL vs F32 on wikitext (2 chunks of 512) more than halved
    (measured 0.0387 -> 0.0161)."""
    from realmodels import f32_reference

    from orkpy._io import read_text_like_llama_cpp

    f32 = f32_reference("smollm2")
    wiki = read_text_like_llama_cpp(shared / "text" / "wikitext-2-raw-test.txt")
    calib = read_text_like_llama_cpp(shared / "text" / "tinystories-val-B.txt")
    rel = _smollm2_rotated_float_equivalence(f32, wiki)
    assert rel < REL, rel

    # (b) outlier channels of the residual stream (the inputs of q/k/v and gate/up: normalized x)
    ratios = {}
    for rot in (None, "hadamard"):
        m = orkpy.load_model(f32, rotate=rot)
        n, chunks = m.chunks(m.tokens(calib[:40_000]), 128, 2)
        st = m.collect_activation_stats(chunks)
        r = []
        for i in range(m.hparams["n_layer"]):
            for t in ("attn_q", "ffn_gate"):
                sums, count = st[f"blk.{i}.{t}.weight"]
                rms = np.sqrt(sums / count)
                r.append(rms.max() / rms.mean())
        ratios[rot] = np.array(r)
    print(f"\nresidual per-channel RMS max/mean: unrotated {ratios[None].min():.1f}..{ratios[None].max():.1f}, "
          f"rotated {ratios['hadamard'].min():.1f}..{ratios['hadamard'].max():.1f}")
    assert ratios[None].min() > 5 and ratios["hadamard"].max() < 3
    assert (ratios[None] > 2.5 * ratios["hadamard"]).all()  # every layer's q and gate inputs

    # (c) w8a8 per token: KL vs F32
    ref = tmp_path / "ref.npz"
    kw = dict(n_ctx=512, chunks=2, progress=False)
    base = orkpy.perplexity(orkpy.load_model(f32), wiki, save_logprobs=ref, **kw)
    kl = {rot: orkpy.perplexity(orkpy.load_model(f32, weights="int8", rotate=rot), wiki, kld_base=ref,
                                **kw).kld["mean"] for rot in (None, "hadamard")}
    print(f"SmolLM2 w8a8 per-token mean KL vs F32 (PPL {base.ppl:.3f}, 2 chunks of 512): "
          f"unrotated {kl[None]:.5f}, rotated {kl['hadamard']:.5f}")
    assert kl["hadamard"] < 0.5 * kl[None]


def test_rotate_placement_without_rotate_is_an_error(shared):
    import orkpy
    with pytest.raises(ValueError, match="needs rotate="):
        orkpy.load_model(shared / "models/stories260K/stories260K-F32.gguf", rotate_placement="online")


# -- the fast Hadamard transform (csrc/ork/hadamard.h) the rotated source computes with --

@pytest.mark.parametrize("n", [1, 2, 64, 576, 640, 1536, 2048, 6144])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_hadamard_rows_equals_the_dense_product(n, threads):
    from orkpy.runtime.hadamard import fast_of, hadamard_factors, paley as _paley
    from orkpy.runtime.rotate import rotation
    p, m = hadamard_factors(n)
    h = hadamard(n)
    hp = _paley(p) if p > 1 else None
    x = np.random.default_rng(n).standard_normal((19, n))
    y = x.copy()
    _core.hadamard_rows(y, hp, 0.5, threads)
    np.testing.assert_allclose(y, 0.5 * (x @ h), rtol=0, atol=1e-12 * np.sqrt(n))
    one = x.copy()
    _core.hadamard_rows(one, hp, 0.5, 1)
    assert np.array_equal(one, y)  # rows apart: the same bytes on any thread count
    q, _ = rotation(n, "hadamard", seed=3)
    f = fast_of(q)
    assert f is not None
    np.testing.assert_allclose(f.right(x), x @ q, rtol=0, atol=1e-13 * np.sqrt(n))
    np.testing.assert_allclose(f.left_t(x.T), q.T @ x.T, rtol=0, atol=1e-13 * np.sqrt(n))
    np.testing.assert_allclose(f.right(x[0]), x[0] @ q, rtol=0, atol=1e-13 * np.sqrt(n))


def test_fast_of_only_the_matrices_it_reproduces():
    from orkpy.runtime.hadamard import fast_of
    from orkpy.runtime.rotate import rotation
    q, _ = rotation(64, "orthogonal", seed=0)
    assert fast_of(q) is None  # a random orthogonal matrix stays a dense product
    h, _ = rotation(64, "hadamard", seed=0)
    bad = h.copy()
    bad[3, 5] = -bad[3, 5]
    assert fast_of(bad) is None and fast_of(h) is not None
    assert fast_of(np.eye(3)) is None  # no Hadamard matrix of order 3


def test_hadamard_rows_refuses_bad_input():
    x = np.zeros((2, 12))
    with pytest.raises(ValueError):
        _core.hadamard_rows(x, None, 1.0)  # 12 is not a power of two
    with pytest.raises(ValueError):
        _core.hadamard_rows(x, np.ones((5, 5)), 1.0)  # 5 does not divide 12
    with pytest.raises(TypeError):
        _core.hadamard_rows(np.zeros((2, 8), np.float32), None, 1.0)
    with pytest.raises(TypeError):
        _core.hadamard_rows(np.zeros((8, 2)).T, None, 1.0)  # not C-contiguous


@pytest.mark.parametrize("case,how", [(c, h) for c in sorted(CASES) + ["gemma3"]
                                      for h in ("hadamard", "orthogonal", "online")
                                      if not (c == "gemma3" and h == "orthogonal")])  # Gemma: Hadamard only
def test_a_linear_computed_in_blocks_equals_the_whole(tmp_path, monkeypatch, case, how):
    """A large transformed weight is computed a block of rows (input side) or of whole heads' columns
    (attn_output / ffn_down) at a time (TransformedSource._blocks, 64 MB of float64 each): every linear
    the same as computed whole, AWQ-style scales folded in too."""
    from orkpy.quantization import awq
    from orkpy.runtime import rotate as rot
    p, _, _ = _make(tmp_path, case)
    src = open_source(p)
    kw = {"hadamard": dict(rotate="hadamard"), "orthogonal": dict(rotate="orthogonal", seed=4),
          "online": dict(rotate="hadamard", online=True, seed=1)}[how]
    t = rotate_source(src, **kw)
    rng = np.random.default_rng(0)
    shapes = t.shapes()
    scales = {k: rng.uniform(0.5, 2.0, shapes[inp][1] if not k.endswith("attn_v>") else
                             t.hp["n_head_kv"] * t.hp["head_dim"])
              for k, _, inp in awq.groups(t.hp)}
    t = awq.apply_awq(t, scales)
    names = [n for n in t.shapes() if n.startswith("blk.") and n.endswith(".weight") and len(t.shapes()[n]) == 2]
    whole = {n: t.tensor(n) for n in names}
    monkeypatch.setattr(rot, "_BLOCK_BYTES", 8 * 8 * 40)  # a few rows / heads per block
    blocked = 0
    for n in names:
        blocked += t._blocks(n) is not None
        got = t.tensor(n)
        if how == "orthogonal":  # dense products: BLAS may round a block of rows otherwise
            np.testing.assert_allclose(got, whole[n], rtol=1e-6, atol=1e-7, err_msg=n)
        else:
            np.testing.assert_array_equal(got, whole[n], err_msg=n)
    assert blocked >= len(names) * 2 // 3, blocked
