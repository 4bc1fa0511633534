"""The activation modes on a real model (SmolLM2-135M, its exact F32 reference): w8a8 mean KL vs
the float model on wikitext (2 chunks of 512), the activations calibrated on TinyStories (4 chunks
of 512) by the rotated float model (Hadamard folded in + the online Hadamard before ffn_down).

Measured margins (bench/act_modes.py, 8 chunks: per_token 0.0055, static mse prefix 1 0.0086,
static max prefix 1 0.0097, static mse prefix 0 0.106; unrotated per_token 0.035, static mse
prefix 1 0.140, max 0.256, outliers 0.013): the gates hold the ratios with room for the 2-chunk noise
(with the rotations, mse and max are too close at 2 chunks to gate their order)."""
import numpy as np
import pytest

import orkpy
from orkpy.runtime.actcal import linear_act
from orkpy.runtime.model import LinearSpec, Model, linear_names, transformed_source
from orkpy.formats.source import open_source
from realmodels import f32_reference

pytestmark = [pytest.mark.slow, pytest.mark.gate]


@pytest.fixture(scope="module")
def scored(shared, tmp_path_factory):
    """The F32 reference, the scored tokens and their reference log-probs (computed once)."""
    f32 = f32_reference("smollm2")
    base = orkpy.load_model(f32)
    tokens = base.tokens((shared / "text" / "wikitext-2-raw-test.txt").read_text(encoding="utf-8"))
    ref = str(tmp_path_factory.mktemp("act") / "ref.npz")
    orkpy.perplexity(base, tokens, n_ctx=512, chunks=2, save_logprobs=ref, progress=False)
    calib = (shared / "text" / "tinystories-val-B.txt").read_text(encoding="utf-8")
    return f32, tokens, ref, calib


def _kl(scored, rotate, online, configs):
    f32, tokens, ref, calib = scored
    src = transformed_source(open_source(f32), rotate, rotate_online=online)
    names = linear_names(src.hp)
    fm = Model(str(f32), src.hp, {n: LinearSpec.f32(n, src.linear(n)) for n in names}, src.tensor, src.meta,
               src.tied, {n: "fp32" for n in names})
    cals = {p: orkpy.calibrate_activations(fm, calib, n_ctx=512, chunks=4, progress=False, prefix=p)
            for p in {c[2] for c in configs}}
    packed = {n: orkpy.pack(orkpy.quantize(src.linear(n), "int8")) for n in names}
    out = {}
    for act, method, prefix in configs:
        lin = {n: LinearSpec.from_packed(n, pw, **linear_act(act, n, cals[prefix], method, 8, "smollm2", pw.K, prefix))
               for n, pw in packed.items()}
        m = Model(str(f32), src.hp, lin, src.tensor, src.meta, src.tied, {n: "int8" for n in names})
        out[(act, method, prefix)] = orkpy.perplexity(m, tokens, n_ctx=512, chunks=2, kld_base=ref,
                                                      progress=False).kld["mean"]
    return out


def test_static_ranges_with_rotation_and_prefix(scored):
    kl = _kl(scored, "hadamard", True, [("per_token", "mse", 1), ("static", "mse", 1), ("static", "mse", 0)])
    tok, mse, p0 = kl[("per_token", "mse", 1)], kl[("static", "mse", 1)], kl[("static", "mse", 0)]
    assert tok < 0.009                       # w8a8 per token with the rotations (8 chunks: 0.0055)
    assert mse < 2.5 * tok                   # one calibrated range per linear (8 chunks: 1.6x)
    assert 5 * mse < p0                      # the first position per token (8 chunks: 12x)


def test_outliers_and_static_ranges_without_rotation(scored):
    kl = _kl(scored, None, False, [("per_token", "mse", 1), ("per_token_outliers", "mse", 1), ("static", "mse", 1),
                                   ("static", "max", 1)])
    assert 2 * kl[("per_token_outliers", "mse", 1)] < kl[("per_token", "mse", 1)]   # 8 chunks: 0.013 vs 0.035
    # the rotation lowers w8a8 KL: unrotated per token stays above twice the rotated gate (< 0.009,
    # test_static_ranges_with_rotation_and_prefix; 8 chunks: 0.035 vs 0.0055)
    assert kl[("per_token", "mse", 1)] > 2 * 0.009
    assert 1.3 * kl[("static", "mse", 1)] < kl[("static", "max", 1)]                 # 8 chunks: 0.140 vs 0.256


def test_gemma3_block_input_rotation_is_exact_in_float_and_lowers_w8a8_kl(shared, tmp_path):
    """Gemma-3-270M: the rotation placed online after its norms (its post-norms keep it out of the
    residual stream) computes the same function in float and cuts w8a8 per-token KL (bench/act_modes.py,
    RTN int8 weights; see docs/results/activation-modes.md for 8 chunks;
    4 chunks: 0.0341 -> 0.0076)."""
    f32 = f32_reference("gemma3")
    base = orkpy.load_model(f32)
    tokens = base.tokens((shared / "text" / "wikitext-2-raw-test.txt").read_text(encoding="utf-8"))
    ref = str(tmp_path / "ref.npz")
    orkpy.perplexity(base, tokens, n_ctx=512, chunks=2, save_logprobs=ref, progress=False)
    del base
    kl = {}
    for label, rot, online, w in (("float", "hadamard", True, "fp32"), ("plain", None, False, "int8"),
                                  ("rotated", "hadamard", True, "int8")):
        m = orkpy.load_model(f32, weights=w, rotate=rot, rotate_online=online)
        if rot:
            assert m.hparams["norm_rot"] and m.hparams["ffn_down_rot"]
        kl[label] = orkpy.perplexity(m, tokens, n_ctx=512, chunks=2, kld_base=ref, progress=False).kld["mean"]
        del m
    assert kl["float"] < 1e-4, kl                    # the rotated float model is the float model
    assert 3 * kl["rotated"] < kl["plain"], kl       # 4 chunks: 4.5x
