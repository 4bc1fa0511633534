"""Regression tests for a review of the C core and bindings."""
import threading

import numpy as np
import pytest

import orkpy
import orkpy._core as C

ST = "models/stories260K/stories260K-F32.gguf"


def test_two_threads_share_a_model_safely(shared):
    m = orkpy.load_model(shared / ST)
    toks = np.random.default_rng(0).integers(3, 512, 4096).astype(np.int32)
    ref = m.forward(toks[:256], first=255, threads=1)
    errors, stop = [], [False]

    def worker():
        while not stop[0]:
            if not np.array_equal(m.forward(toks[:256], first=255, threads=1), ref):
                errors.append("forward changed")
    t = threading.Thread(target=worker)
    t.start()
    try:
        for _ in range(30):
            orkpy.collect_imatrix(m, toks, n_ctx=64, chunks=1, threads=1, progress=False)
    finally:
        stop[0] = True
        t.join()
    assert not errors


def test_forward_model_cannot_be_initialised_twice(shared):
    m = orkpy.load_model(shared / ST)
    with pytest.raises(RuntimeError, match="twice"):
        m._fwd.__init__({}, None, None, None, [])


def test_absurd_head_counts_refused(tmp_path):
    D, V = 32, 16
    rng = np.random.default_rng(0)
    lin = lambda n, k: ("f32", rng.standard_normal((n, k)).astype(np.float32))  # noqa: E731
    hp = dict(n_layer=1, n_embd=D, n_head=2**62 + 8, n_head_kv=2**62 + 8, head_dim=4, n_ff=64, n_vocab=V, n_rot=4,
              rope_type=0, rope_base=1e4, rope_freq_scale=1.0, norm_eps=1e-5)
    layer = {"attn_norm": np.ones(D, np.float32), "ffn_norm": np.ones(D, np.float32), "wq": lin(D, D), "wk": lin(D, D),
             "wv": lin(D, D), "wo": lin(D, D), "w_gate": lin(64, D), "w_up": lin(64, D), "w_down": lin(D, 64)}
    with pytest.raises(ValueError, match="out of range"):
        C.ForwardModel(hp, rng.standard_normal((V, D)).astype(np.float32), np.ones(D, np.float32), lin(V, D), [layer])


def test_int8_minus_128_refused():
    codes = np.ones((32, 32), np.int8)
    codes[0, 0] = -128
    with pytest.raises(ValueError, match="-128"):
        C.pack(codes, "int8", 32, 32)


def test_token_ids_are_checked(shared):
    m = orkpy.load_model(shared / ST)
    with pytest.raises(ValueError, match="out of range"):
        m.forward([1, 2**32 + 3, 5])
    with pytest.raises(TypeError, match="integers"):
        m.forward(np.array([1.0, 3.99]))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        orkpy.ppl.tokens_for_ppl(m, np.array([3, 600]))


def test_add_bos_false_is_honoured(shared):
    m = orkpy.load_model(shared / ST)
    text = "Once upon a time there was a little dog. " * 60
    a = orkpy.perplexity(m, text, n_ctx=64, add_bos=False, progress=False)
    b = orkpy.perplexity(m, m.tokenizer.encode(text, add_special=False), n_ctx=64, add_bos=False, progress=False)
    assert a.ppl == b.ppl and a.n_tokens == b.n_tokens


def test_imatrix_refused_while_ffn_chain_is_on(shared):
    from orkpy import ffn
    m = orkpy.load_model(shared / ST, weights="int8")
    toks = np.random.default_rng(0).integers(3, 512, 512)
    st = ffn.prep(m, toks, n_ctx=64, chunks=2)
    ffn.configure(m, st, "fused")
    with pytest.raises(ValueError, match="fused FFN chain"):
        orkpy.collect_imatrix(m, toks, n_ctx=64, chunks=2, progress=False)
    with pytest.raises(ValueError, match="finite"):
        m._fwd.set_ffn(0, dict(mode="fused", lut_step=1e39, s_scale=1.0, u_scale=1.0, p_scale=1.0))


def test_minus_zero_scale_normalised(tmp_path):
    q = orkpy.quantize(np.ones((2, 32), np.float32), "nf4")
    import dataclasses
    q = dataclasses.replace(q, scales=np.array([-0.0, 1.0], np.float32))
    pw = orkpy.pack(q)
    orkpy.save_packed(pw, tmp_path / "w.o4n1")
    assert orkpy.load_packed(tmp_path / "w.o4n1").bscale[0] == 0.0


def test_to_model_caches_per_activation_mode(shared):
    st = shared / "models/stories260K"
    qm = orkpy.quantize_model(st / "stories260K-F16.gguf", st / "stories260K-Q4_0.gguf", progress=False,
                              log=lambda m: None)
    a, b = qm.to_model(), qm.to_model(act="per_tensor")
    assert a is not b and a is qm.to_model()
    toks = np.arange(1, 64)
    assert not np.array_equal(a.forward(toks), b.forward(toks))
    with pytest.raises(ValueError, match="act"):
        qm.to_model(act="bogus")


def test_set_ffn_releases_replaced_arrays_and_names_missing_keys(shared):
    import sys
    from orkpy import ffn
    m = orkpy.load_model(shared / ST, weights="int8")
    st = ffn.prep(m, np.random.default_rng(0).integers(3, 512, 512), n_ctx=64, chunks=2)
    p = ffn.layer_params(st[0], "per_channel_out")
    a = np.ascontiguousarray(p["s_scale_ch"])
    before = sys.getrefcount(a)
    m._fwd.set_ffn(0, dict(p, s_scale_ch=a))
    assert sys.getrefcount(a) == before + 1          # held while in use
    m._fwd.set_ffn(0, dict(p, s_scale_ch=a.copy()))
    assert sys.getrefcount(a) == before              # released when replaced
    with pytest.raises(ValueError, match="'mode'"):
        m._fwd.set_ffn(0, {"lut_step": 1.0})
    with pytest.raises(ValueError, match="missing 'u_scale'"):
        m._fwd.set_ffn(0, {"mode": "fused", "lut_step": 0.1, "s_scale": 0.1, "p_scale": 0.1})
