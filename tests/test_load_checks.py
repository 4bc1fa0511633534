"""What loading a model refuses before it computes anything (docs/security.md, "Model files"):
non-finite weights (any tensor the model uses, by name), a RoPE dimension count llama.cpp does not
run, and a vocabulary whose size is not the embedding table's / the head's row count. Each was
found by an attack campaign: the file loaded and then gave NaN or different logits, or failed only
inside ``generate``. The files are written with orkpy's own GGUF writer (tests/archgen.py)."""
import numpy as np
import pytest

import orkpy
from orkpy import FormatError
from orkpy import _core
from orkpy.formats.gguf_write import metadata_triples, write_gguf
from orkpy.formats.tiermap import TierEntry

import archgen

LLAMA = dict(qkv_bias=True, ffn_bias=True, rope_freqs=True)


def _llama(tmp_path, name="m.gguf", **kw):
    p = tmp_path / name
    T, c = archgen.make("llama", p, **dict(LLAMA, **kw))
    return p, T


def _rewrite(src, dst, T, changes=None, meta=None):
    """``src``'s metadata (edited by ``meta(list) -> list``) with the tensors ``T`` updated by ``changes``."""
    md = metadata_triples(str(src))
    if meta is not None:
        md = meta(md)
    T = dict(T, **(changes or {}))
    write_gguf(dst, md, list(T.items()))
    return dst


def _poisoned(T, name, value, at=None):
    a = np.array(T[name], copy=True)
    idx = at if at is not None else tuple(s // 2 for s in a.shape)
    a[idx] = value
    return a, idx


# ------------------------------------------------------------ non-finite --

def test_find_nonfinite():
    a = np.ones(5000, np.float32)
    assert _core.find_nonfinite(a) == -1
    for i, v in ((0, np.nan), (4999, np.inf), (1024, -np.inf), (3071, np.float32("nan"))):
        b = a.copy()
        b[i] = v
        assert _core.find_nonfinite(b) == i
    b = a.copy()
    b[[7, 2000]] = np.nan
    assert _core.find_nonfinite(b) == 7                                      # the first one
    big = np.array([np.finfo(np.float32).max, -np.finfo(np.float32).max, 1e-45, -0.0], np.float32)
    assert _core.find_nonfinite(big) == -1                                   # extremes are finite
    h = np.array([65504, -65504, 6e-8, 1], np.float16)
    assert _core.find_nonfinite(h) == -1
    h[3] = np.inf
    assert _core.find_nonfinite(h) == 3
    m = np.ones((4, 6), np.float32)
    m[2, 5] = np.nan
    assert _core.find_nonfinite(m) == 17 and _core.find_nonfinite(m[:, ::2]) == -1   # shape / strides
    assert _core.find_nonfinite(np.zeros((0, 3), np.float32)) == -1
    with pytest.raises(TypeError):
        _core.find_nonfinite(np.ones(3, np.float64))


def test_dequantize_raw_checked_finds_the_first_non_finite_value():
    # Q8_0 blocks: a float16 scale d and 32 int8 codes; d = Inf (code 0: NaN, code 1: Inf) in two blocks
    nb = 20000
    blocks = np.zeros((nb, 34), np.uint8)
    blocks[:, 0:2] = np.frombuffer(np.float16(0.5).tobytes(), np.uint8)
    blocks[:, 2:] = 3
    for b, k in ((12345, 7), (15000, 0)):
        blocks[b, 0:2] = np.frombuffer(np.float16(np.inf).tobytes(), np.uint8)
        blocks[b, 2:2 + k] = 0      # 0 x Inf = NaN too
    raw = blocks.reshape(-1)
    ref = _core.dequantize_raw(raw, 8, nb * 32)
    for threads in (1, 2):
        a, bad = _core.dequantize_raw_checked(raw, 8, nb * 32, threads)
        np.testing.assert_array_equal(a, ref)
        assert bad == 12345 * 32 == _core.find_nonfinite(ref, threads)
    blocks[[12345, 15000], 0:2] = blocks[0, 0:2]
    assert _core.dequantize_raw_checked(blocks.reshape(-1), 8, nb * 32)[1] == -1
    big = np.ones(3_000_000, np.float32)    # the parallel scan: chunks of 256K values
    big[[2_900_000, 1_000_001]] = np.nan
    assert _core.find_nonfinite(big, 2) == 1_000_001 and _core.find_nonfinite(big, 1) == 1_000_001


def test_quantized_gguf_with_a_non_finite_block_scale_is_refused(shared, tmp_path):
    # a Q4_0 block scale (float16) set to NaN in a copy of stories260K: found while dequantizing
    src = shared / "models/stories260K/stories260K-Q4_0.gguf"
    with orkpy.GGUFFile(src) as g:
        t = g.tensor_info("blk.3.ffn_up.weight")
        assert t.type == "Q4_0"
        off = t.data_offset + 5 * 18          # block 5 (18 bytes: d, 16 bytes of codes)
    data = bytearray(src.read_bytes())
    data[off:off + 2] = np.float16(np.nan).tobytes()
    bad = tmp_path / "nan-scale.gguf"
    bad.write_bytes(bytes(data))
    K = t.shape[1]
    with pytest.raises(FormatError, match=rf"nan-scale\.gguf: tensor 'blk\.3\.ffn_up\.weight' has a non-finite value "
                                          rf"\(nan\) at \[{5 * 32 // K}, {5 * 32 % K}\]"):
        orkpy.load_model(bad)
    orkpy.load_model(src)


# every kind of tensor the forward pass uses: norms, embedding, biases, RoPE factors, linears, head
POISON = [("blk.1.ffn_norm.weight", np.nan), ("output_norm.weight", np.inf), ("token_embd.weight", np.nan),
          ("blk.0.attn_q.bias", -np.inf), ("blk.2.ffn_down.bias", np.nan), ("rope_freqs.weight", np.inf),
          ("blk.2.ffn_down.weight", np.nan), ("output.weight", -np.inf), ("blk.0.attn_norm.weight", np.nan)]


@pytest.mark.parametrize("weights", ["gguf", "int8"])
@pytest.mark.parametrize("name,value", POISON)
def test_load_refuses_a_non_finite_tensor_by_name(tmp_path, name, value, weights):
    # before: a NaN norm weight on the F32 path loaded, forward returned NaN logits and
    # generate(temperature=0) returned '' or ' t t t t'
    p, T = _llama(tmp_path, "clean.gguf")
    a, idx = _poisoned(T, name, value)
    bad = _rewrite(p, tmp_path / "bad.gguf", T, {name: a})
    at = ", ".join(map(str, idx))
    with pytest.raises(FormatError, match=rf"bad\.gguf: tensor '{name}' has a non-finite value \({value}\) at \[{at}\]"):
        orkpy.load_model(bad, weights=weights)
    orkpy.load_model(p, weights=weights)   # the clean file loads


def test_load_refuses_non_finite_in_float16_and_fused_tensors(tmp_path):
    # F16 linears (dequantized copies) and phi3's fused attn_qkv / gate+up, split when opened
    p = tmp_path / "phi3.gguf"
    T, _ = archgen.make("phi3", p, qkv_bias=True, dtype=np.float16)
    for name in ("blk.1.attn_qkv.weight", "blk.0.ffn_up.weight", "blk.2.attn_qkv.bias"):
        a, idx = _poisoned(T, name, np.nan)
        bad = _rewrite(p, tmp_path / "bad16.gguf", T, {name: a})
        with pytest.raises(FormatError, match=rf"tensor '{name}' has a non-finite value \(nan\)"):
            orkpy.load_model(bad)
        with pytest.raises(FormatError, match=rf"tensor '{name}' has a non-finite value \(nan\)"):
            orkpy.load_model(bad, weights="int8")


def _int8_map(path):
    tm = orkpy.tier_map(path)
    entries = {n: (TierEntry("int8", "Q8_0", e.shape) if len(e.shape) == 2 and n != "token_embd.weight" else e)
               for n, e in tm.entries.items()}
    return orkpy.TierMap(entries, tm.threshold, tm.source, tm.tied)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("name", ["blk.1.ffn_norm.weight", "token_embd.weight", "blk.0.attn_v.bias",
                                  "blk.2.attn_k.weight", "output.weight"])
def test_quantize_model_refuses_a_non_finite_tensor_by_name(tmp_path, name, dtype):
    # before: a NaN norm or embedding was written into the model, which failed at forward with
    # "activation has a non-finite value (NaN) at [0, 0]", naming no tensor
    p, T = _llama(tmp_path, "clean.gguf", dtype=dtype)
    a, idx = _poisoned(T, name, np.nan)
    bad = _rewrite(p, tmp_path / "bad.gguf", T, {name: a})
    tm = _int8_map(p)
    lines = []
    with pytest.raises(FormatError, match=rf"bad\.gguf: tensor '{name}' has a non-finite value \(nan\)"):
        orkpy.quantize_model(bad, alloc=tm, progress=False, log=lines.append, output=tmp_path / "out")
    assert not (tmp_path / "out").exists()
    if T[name].ndim == 1 or name == "token_embd.weight":   # refused before any linear was rounded
        assert not lines
    qm = orkpy.quantize_model(p, alloc=tm, progress=False, log=lambda s: None)
    assert np.isfinite(qm.to_model().forward(archgen.tokens(16))).all()


def test_safetensors_source_refuses_a_non_finite_tensor_by_name(tmp_path):
    st_np = pytest.importorskip("safetensors.numpy")
    from orkpy.formats.source import _HF_NAMES, _HF_TOP

    p, T = _llama(tmp_path, "meta.gguf", rope_freqs=False, ffn_bias=False, qkv_bias=False)
    inv = {v: k for k, v in _HF_NAMES.items()}
    top = {v: k for k, v in _HF_TOP.items()}
    hf = {}
    for n, a in T.items():
        if n in top:
            hf[top[n]] = a
        else:
            _, i, stem, kind = n.split(".")
            hf[f"model.layers.{i}.{inv[stem]}.{kind}"] = a
    hf["model.layers.1.post_attention_layernorm.weight"] = hf["model.layers.1.post_attention_layernorm.weight"].copy()
    hf["model.layers.1.post_attention_layernorm.weight"][3] = np.inf
    d = tmp_path / "hf"
    d.mkdir()
    st_np.save_file(hf, str(d / "model.safetensors"))
    with pytest.raises(FormatError, match=r"hf: tensor 'blk\.1\.ffn_norm\.weight' \(stored as 'model\.layers\.1\."
                                          r"post_attention_layernorm\.weight'\) has a non-finite value \(inf\) at \[3\]"):
        orkpy.load_model(d, meta=p)


def test_forward_of_a_clean_file_is_unchanged_by_the_check(tmp_path):
    # the scan reads the mapped F32 tensors in place: same logits, bit for bit, as the float64-free path
    p, T = _llama(tmp_path)
    tok = archgen.tokens(32)
    a = orkpy.load_model(p).forward(tok)
    b = orkpy.load_model(p).forward(tok)
    np.testing.assert_array_equal(a, b)
    assert np.isfinite(a).all()


# ------------------------------------------------------------- RoPE dims --

@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("n_rot", [0, 8, 6, 7, 32])
def test_rope_dimension_count_must_be_the_head_size_for_llama_qwen(tmp_path, arch, n_rot):
    # llama.cpp: llama refuses the file ("invalid n_rot: 0, expected 16"), qwen2 / qwen3 abort in their
    # graphs (GGML_ASSERT(n_embd_head == n_rot)); before, orkpy ran n_rot = 0 without RoPE
    p = tmp_path / "m.gguf"
    archgen.make(arch, p, n_rot=n_rot)
    with pytest.raises(FormatError, match=rf"m\.gguf: '{arch}\.rope\.dimension_count' = {n_rot}: .*expected the "
                                          r"head size 16"):
        orkpy.load_model(p)
    archgen.make(arch, p, n_rot=16)
    orkpy.load_model(p)


@pytest.mark.parametrize("arch", ["gemma3", "phi3"])
def test_rope_dimension_count_partial_or_refused(tmp_path, arch):
    # llama.cpp's RoPE kernel asserts an even count at most the head size and loops for ever on 0;
    # an even count below the head size rotates that many dimensions (test_arch_oracle.py: same logits)
    p = tmp_path / "m.gguf"
    for n_rot in (0, 7, 18, 64):
        archgen.make(arch, p, n_rot=n_rot)
        with pytest.raises(FormatError, match=rf"'{arch}\.rope\.dimension_count' = {n_rot}: expected an even number "
                                              r"of dimensions in \[2, 16\]"):
            orkpy.load_model(p)
    tok = archgen.tokens(24)
    archgen.make(arch, p, n_rot=8)
    half = orkpy.load_model(p).forward(tok)
    archgen.make(arch, p)
    full = orkpy.load_model(p).forward(tok)
    assert np.isfinite(half).all() and not np.allclose(half, full)


# ------------------------------------------------------------ vocabulary --

def _vocab_meta(n):
    def edit(md):
        out = []
        for k, t, v in md:
            if k in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
                v = v[:n]   # a list of str or a NumPy array
            out.append((k, t, v))
        return out
    return edit


def test_vocabulary_must_match_the_embedding_rows(tmp_path):
    # before: a 3-token vocabulary with a 512-row embedding loaded and failed only inside generate.
    # llama.cpp creates token_embd / output with vocab.n_tokens() rows and refuses any other shape
    # (no padding rows): so does orkpy, both ways
    p, T = _llama(tmp_path)
    small = _rewrite(p, tmp_path / "small.gguf", T, meta=_vocab_meta(3))
    with pytest.raises(FormatError, match=r"small\.gguf: the vocabulary \('tokenizer\.ggml\.tokens'\) has 3 tokens "
                                          r"but tensor 'token_embd\.weight' has 512 rows"):
        orkpy.load_model(small)
    # a vocabulary larger than the table: a table of 300 rows (and a head of 300) for 512 tokens
    cut = {"token_embd.weight": T["token_embd.weight"][:300], "output.weight": T["output.weight"][:300]}
    big = _rewrite(p, tmp_path / "big.gguf", T, cut)
    with pytest.raises(FormatError, match=r"has 512 tokens but tensor 'token_embd\.weight' has 300 rows"):
        orkpy.load_model(big)
    # the head's rows too
    head = _rewrite(p, tmp_path / "head.gguf", T, {"output.weight": T["output.weight"][:500]})
    with pytest.raises(FormatError, match=r"head\.gguf: tensor 'output\.weight' has 500 rows, expected 512"):
        orkpy.load_model(head)
    # and quantize_model refuses the same files before any work
    with pytest.raises(FormatError, match="has 3 tokens"):
        orkpy.quantize_model(small, alloc=_int8_map(p), progress=False, log=lambda s: None)
    m = orkpy.load_model(p)
    assert m.n_vocab == len(m.tokenizer) == 512


def test_vocabulary_sized_file_generates(tmp_path):
    p, T = _llama(tmp_path)
    m = orkpy.load_model(p)
    out = m.generate("Once upon a time", max_tokens=8, temperature=0)
    assert isinstance(out, str)
