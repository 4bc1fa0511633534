"""The model a block at a time (orkpy/runtime/blocks.py, csrc/ork/model.h ork_model_forward_hidden):
calibration rows run layer by layer through one-layer C models give, bit for bit, what a
whole-model pass gives -- every linear's Gram matrix, activation statistics and imatrix sums,
the head's too, and the final hidden rows (their logits) -- on every architecture case of
tests/test_arch.py, rotated sources included; bad calls raise named errors."""
import numpy as np
import pytest

from orkpy.formats.source import open_source
from orkpy.runtime.blocks import Block, Stream, embed, input_stats, layer_linears
from orkpy.runtime.linear import LinearSpec
from orkpy.runtime.model import float_model, linear_names, transformed_source

import archgen
from test_arch import CASES, _make


def _chunks(m, n=2, T=40):
    tok = archgen.tokens(n * T)
    return [np.asarray(tok[i * T:(i + 1) * T], np.int32) for i in range(n)]


def _stream_stats(src, chunks):
    st = Stream(src, chunks)
    got = {"grams": {}, "acts": {}, "imatrix": {}}
    for l in range(src.hp["n_layer"]):
        b = Block(src, l, {n: LinearSpec.f32(n, src.linear(n)) for n in layer_linears(l)})
        r = b.run(st, grams=layer_linears(l), act_prefix=1, imatrix=True)
        for k in got:
            got[k].update(r[k])
    h = b.head_stats(st, gram=True, act_prefix=1, imatrix=True)
    for k in got:
        got[k].update(h[k])
    return st, b, got


def _check(src, chunks):
    m = float_model(src)
    names = linear_names(src.hp)
    G = m.collect_grams(chunks, names)
    A = m.collect_act_stats(chunks, prefix=1)
    I = m.collect_activation_stats(chunks)
    st, b, got = _stream_stats(src, chunks)
    for n in names:
        assert np.array_equal(got["grams"][n][0], G[n][0]) and got["grams"][n][1] == G[n][1], n
        assert np.array_equal(got["imatrix"][n][0], I[n][0]) and got["imatrix"][n][1] == I[n][1], n
        for k, v in A[n].items():
            assert np.array_equal(np.asarray(got["acts"][n][k]), np.asarray(v)), (n, k)
    # the final rows give the whole model's logits through its real head
    for c, x in zip(chunks, st.xs):
        np.testing.assert_array_equal(m._fwd.forward_hidden(x.copy(), layers=0, logits=True), m.forward(c))


@pytest.mark.parametrize("case", sorted(CASES))
def test_block_stream_equals_whole_model_pass(tmp_path, case):
    p, _, _ = _make(tmp_path, case)
    src = open_source(str(p))
    _check(src, _chunks(src, T=30 if "longrope" in case else 40))


@pytest.mark.parametrize("case", ["llama", "gemma3"])
def test_block_stream_on_a_rotated_source(tmp_path, case):
    p, _, _ = _make(tmp_path, case)
    src = transformed_source(open_source(str(p)), "hadamard", 0)
    _check(src, _chunks(src))


def test_embed_reads_rows_as_the_table(tmp_path):
    p, _, _ = _make(tmp_path, "gemma3")  # an embedding scale
    src = open_source(str(p))
    tok = np.asarray(archgen.tokens(50), np.int32)
    m = float_model(src)
    x = embed(src, tok)
    want = src.tensor("token_embd.weight")[tok] * np.float32(src.hp["embd_scale"])
    np.testing.assert_array_equal(x, want)
    np.testing.assert_array_equal(m._fwd.forward_hidden(x.copy(), layers=-1, logits=True), m.forward(tok))


def test_bad_calls_raise_named_errors(tmp_path):
    p, _, _ = _make(tmp_path, "llama")
    src = open_source(str(p))
    st = Stream(src, _chunks(src))
    b1 = Block(src, 1, {n: LinearSpec.f32(n, src.linear(n)) for n in layer_linears(1)})
    with pytest.raises(ValueError, match="enter layer 0, not layer 1"):
        b1.run(st)
    b0 = Block(src, 0, {n: LinearSpec.f32(n, src.linear(n)) for n in layer_linears(0)})
    with pytest.raises(ValueError, match="not a linear of layer 0"):
        b0.run(st, grams=["blk.1.attn_q.weight"])
    with pytest.raises(ValueError, match="after every layer"):
        b0.head_stats(st, gram=True)
    fwd = float_model(src)._fwd
    D = src.hp["n_embd"]
    with pytest.raises(TypeError, match="writeable C-contiguous"):
        fwd.forward_hidden(np.zeros((4, D), np.float64))
    ro = np.zeros((4, D), np.float32)
    ro.setflags(write=False)
    with pytest.raises(TypeError, match="writeable"):
        fwd.forward_hidden(ro)
    with pytest.raises(ValueError, match="n_embd"):
        fwd.forward_hidden(np.zeros((4, D + 1), np.float32))
    with pytest.raises(ValueError, match="layers must be in"):
        fwd.forward_hidden(np.zeros((4, D), np.float32), layers=src.hp["n_layer"] + 1)
    with pytest.raises(ValueError, match="first must be in"):
        fwd.forward_hidden(np.zeros((4, D), np.float32), first=4, logits=True)
    x = np.full((4, D), np.nan, np.float32)
    assert fwd.forward_hidden(x, layers=0) is None  # no layer, no head: nothing runs, x as it was
    assert np.isnan(x).all()


@pytest.mark.parametrize("case", ["llama", "gemma3", "llama-tied-fused_qkv"])
def test_captured_inputs_give_the_hooks_statistics(tmp_path, case):
    """A block's captured linear inputs are the rows its hooks see: their statistics
    (input_stats) equal the act-stats hook's bit for bit (the prefix left out per chunk), and
    divided by a per-column scale they equal the hook's statistics of the scaled values."""
    p, _, _ = _make(tmp_path, case)
    src = open_source(str(p))
    chunks = _chunks(src, n=3, T=37)
    st = Stream(src, chunks)
    rng = np.random.default_rng(0)
    for l in range(src.hp["n_layer"]):
        names = layer_linears(l)
        b = Block(src, l, {n: LinearSpec.f32(n, src.linear(n)) for n in names})
        before = [x.copy() for x in st.xs]
        r = b.run(st, act_prefix=2, capture=names, advance=False, grams=names[:1])
        assert all(np.array_equal(x, y) for x, y in zip(before, st.xs))  # advance=False: rows unmoved
        calls = [c.size for c in chunks]
        for n in names:
            x = r["inputs"][n]
            assert x.dtype == np.float32 and x.shape == (sum(calls), src.linear(n).shape[1])
            got = input_stats(x, calls, 2)
            for k, v in r["acts"][n].items():
                assert np.array_equal(np.asarray(got[k]), np.asarray(v)), (n, k)
            s = rng.uniform(0.5, 2.0, x.shape[1]).astype(np.float32)
            want = input_stats(x / s, calls, 2)
            got = input_stats(x, calls, 2, divisor=s)
            for k, v in want.items():
                assert np.array_equal(np.asarray(got[k]), np.asarray(v)), (n, k)
        b.run(st, capture=names[:2])  # advancing: the next layer's rows
    with pytest.raises(ValueError, match="calls hold"):
        input_stats(np.zeros((4, 3), np.float32), [3], 0)
    with pytest.raises(ValueError, match="divisor"):
        input_stats(np.zeros((4, 3), np.float32), [4], 0, divisor=np.array([1, 0, 1]))
    from orkpy import _core  # counts summing to 2^64 + 4 (4 rows, wrapped): refused, nothing read past x
    with pytest.raises(ValueError, match=r"calls\[1\] = \d+ rows"):
        _core.act_stats_rows(np.zeros((4, 3), np.float32), [2, 2**63 - 1, 2**63 - 1, 4])
    with pytest.raises(ValueError, match="prefix"):
        _core.act_stats_rows(np.zeros((4, 3), np.float32), [4], -1)
    b0 = Block(src, 0, {n: LinearSpec.f32(n, src.linear(n)) for n in layer_linears(0)})
    with pytest.raises(ValueError, match="not a linear of layer"):
        b0.run(Stream(src, chunks), capture=["blk.1.attn_q.weight"])
    fwd = float_model(src)._fwd
    fwd.capture_enable([0], 1)  # room for one row: a chunk of more is refused, nothing appended
    with pytest.raises(ValueError, match="capture holds 1 rows"):
        fwd.forward_hidden(embed(src, chunks[0]), layers=1)
    assert fwd.capture_take()[0].shape == (0, src.linear(linear_names(src.hp)[0]).shape[1])
    with pytest.raises(RuntimeError, match="not enabled"):
        fwd.capture_take()
