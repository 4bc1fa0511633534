"""The architecture table's cells beyond loading (docs/api.md "Architectures and real models"): on a synthetic
model of every architecture (tests/archgen.py, written with orkpy's writer), the quantizer
(quantize_model with a mixed int8/int4 tier map, saved and reloaded), imatrix collection,
the fused FFN chain (SiLU or Gemma's GELU-tanh LUT) and the NPU path (every packed linear
on the emulator, bit-identical to the CPU) all run and stay close to the float model."""
import numpy as np
import pytest

import archgen
import orkpy
from orkpy import ffn, npu
from orkpy.formats.arch import SUPPORTED
from orkpy.formats.source import open_source
from orkpy.formats.tiermap import TierEntry, TierMap


def _model(tmp_path, arch):
    p = tmp_path / f"{arch}.gguf"
    archgen.make(arch, p, n_layer=2, D=64, H=4, HKV=2, F=96, scale=0.3)  # tame logits (std ~0.8)
    return p


def _tiers(p):
    """int4 for attention, int8 for the FFN and head, float for the embedding (a tied head: float too)."""
    shapes = open_source(p).shapes()
    ents = {}
    for n, shape in shapes.items():
        if len(shape) != 2:
            continue
        tier = "float" if n == "token_embd.weight" else "int4" if ".attn_" in n else "int8"
        ents[n] = TierEntry(tier, {"float": "F32", "int4": "Q4_0", "int8": "Q8_0"}[tier], tuple(shape))
    return TierMap(ents)


def _kl(a, b):
    return archgen.compare(b, a)[2]


@pytest.mark.parametrize("arch", SUPPORTED)
def test_quantize_imatrix_ffn_chain_and_npu_on_every_architecture(tmp_path, arch):
    p = _model(tmp_path, arch)
    ref = orkpy.load_model(p)
    toks = archgen.tokens(128)
    f32 = ref.forward(toks)

    # imatrix: one row of statistics per linear input, counts = tokens seen
    im = orkpy.collect_imatrix(ref, toks, n_ctx=64, progress=False)
    assert set(im.names()) >= {n for n in ref.linears if n != "output.weight"}

    # quantize_model with a mixed tier map, saved and reloaded
    qm = orkpy.quantize_model(p, _tiers(p), imatrix=im, progress=False, log=lambda s: None)
    out = tmp_path / f"{arch}-q"
    qm.save(out)
    q = orkpy.load_model(out)
    kl_q = _kl(f32, q.forward(toks))
    assert 0 < kl_q < 0.1, kl_q

    # the fused FFN chain (SiLU or GELU-tanh LUT) on every layer
    w8 = orkpy.load_model(p, weights="int8")
    base = w8.forward(toks)
    stats = ffn.prep(w8, toks, n_ctx=64)
    ffn.configure(w8, stats, "fused")
    fused = w8.forward(toks)
    assert not np.array_equal(fused, base)
    assert _kl(base, fused) < 0.05
    # the chain's activation is the model's: its exact-activation mode stays next to the per-op pass
    # (a SiLU chain on a GELU model, or the reverse, is far off)
    ffn.configure(w8, stats, "exact_silu")
    assert _kl(base, w8.forward(toks)) < 2e-3
    ffn.configure(w8, stats, "baseline")
    assert np.array_equal(w8.forward(toks), base)

    # the NPU path: every packed linear on the emulator, bit-identical to the CPU kernels
    cpu = q.forward(toks)
    assert q.route_linears(npu.Device("emu")) > 0
    np.testing.assert_array_equal(q.forward(toks), cpu)
