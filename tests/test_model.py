"""The C forward pass against an independent NumPy implementation on tiny
1-layer models (llama and qwen3 layouts), hand-checkable special cases,
causality, weight paths and bad input."""
import numpy as np
import pytest

import orkpy
from ggufgen import FLOAT32, FLOAT64, STRING, UINT32, build, kv
from orkpy.runtime.model import load_model


def tiny_gguf(tmp_path, arch="llama", seed=0, zero_residual=False, tied=False):
    rng = np.random.default_rng(seed)
    D, F, H, HKV, V = 16, 24, 4, 2, 40
    hd = 8 if arch == "qwen3" else D // H
    T = {}
    T["token_embd.weight"] = rng.standard_normal((V, D))
    T["output_norm.weight"] = 1 + 0.1 * rng.standard_normal(D)
    if not tied:
        T["output.weight"] = rng.standard_normal((V, D)) * 0.3
    T["blk.0.attn_norm.weight"] = 1 + 0.1 * rng.standard_normal(D)
    T["blk.0.attn_q.weight"] = rng.standard_normal((H * hd, D)) * 0.3
    T["blk.0.attn_k.weight"] = rng.standard_normal((HKV * hd, D)) * 0.3
    T["blk.0.attn_v.weight"] = rng.standard_normal((HKV * hd, D)) * 0.3
    T["blk.0.attn_output.weight"] = rng.standard_normal((D, H * hd)) * 0.3 * (0 if zero_residual else 1)
    T["blk.0.ffn_norm.weight"] = 1 + 0.1 * rng.standard_normal(D)
    T["blk.0.ffn_gate.weight"] = rng.standard_normal((F, D)) * 0.3
    T["blk.0.ffn_up.weight"] = rng.standard_normal((F, D)) * 0.3
    T["blk.0.ffn_down.weight"] = rng.standard_normal((D, F)) * 0.3 * (0 if zero_residual else 1)
    if arch == "qwen3":
        T["blk.0.attn_q_norm.weight"] = 1 + 0.1 * rng.standard_normal(hd)
        T["blk.0.attn_k_norm.weight"] = 1 + 0.1 * rng.standard_normal(hd)
    T = {k: v.astype(np.float32) for k, v in T.items()}
    kvs = [kv("general.architecture", STRING, arch), kv(f"{arch}.block_count", UINT32, 1),
           kv(f"{arch}.embedding_length", UINT32, D), kv(f"{arch}.feed_forward_length", UINT32, F),
           kv(f"{arch}.attention.head_count", UINT32, H), kv(f"{arch}.attention.head_count_kv", UINT32, HKV),
           kv(f"{arch}.attention.layer_norm_rms_epsilon", FLOAT32, 1e-5), kv(f"{arch}.context_length", UINT32, 64),
           kv(f"{arch}.rope.freq_base", FLOAT32, 10000.0)]
    if arch == "qwen3":
        kvs.append(kv(f"{arch}.attention.key_length", UINT32, hd))
    else:
        kvs.append(kv(f"{arch}.rope.dimension_count", UINT32, hd))
    tensors = [(n, tuple(reversed(a.shape)), 0, a.tobytes()) for n, a in T.items()]
    data, _ = build(kvs, tensors)
    p = tmp_path / f"tiny-{arch}.gguf"
    p.write_bytes(data)
    return p, T, dict(D=D, F=F, H=H, HKV=HKV, V=V, hd=hd, arch=arch)


def np_forward(T, c, tokens, tied=False):
    """Independent NumPy (float64) implementation of the documented forward pass."""
    eps = 1e-5

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    def rope(v, pos, neox):
        d = v.shape[-1]
        out = v.copy()
        for i in range(d // 2):
            th = pos * 10000.0 ** (-2 * i / d)
            a, b = (i, i + d // 2) if neox else (2 * i, 2 * i + 1)
            out[..., a] = v[..., a] * np.cos(th) - v[..., b] * np.sin(th)
            out[..., b] = v[..., a] * np.sin(th) + v[..., b] * np.cos(th)
        return out

    H, HKV, hd, n = c["H"], c["HKV"], c["hd"], len(tokens)
    W = {k: v.astype(np.float64) for k, v in T.items()}
    x = W["token_embd.weight"][tokens]
    h = rms(x, W["blk.0.attn_norm.weight"])
    q = (h @ W["blk.0.attn_q.weight"].T).reshape(n, H, hd)
    k = (h @ W["blk.0.attn_k.weight"].T).reshape(n, HKV, hd)
    v = (h @ W["blk.0.attn_v.weight"].T).reshape(n, HKV, hd)
    neox = c["arch"] == "qwen3"
    if neox:
        q = rms(q, W["blk.0.attn_q_norm.weight"])
        k = rms(k, W["blk.0.attn_k_norm.weight"])
    for t in range(n):
        q[t] = rope(q[t], t, neox)
        k[t] = rope(k[t], t, neox)
    att = np.zeros((n, H, hd))
    for hh in range(H):
        kh = hh // (H // HKV)
        s = q[:, hh] @ k[:, kh].T / np.sqrt(hd)
        s = s + np.triu(np.full((n, n), -np.inf), 1)
        p = np.exp(s - s.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        att[:, hh] = p @ v[:, kh]
    x = x + att.reshape(n, H * hd) @ W["blk.0.attn_output.weight"].T
    h = rms(x, W["blk.0.ffn_norm.weight"])
    g, u = h @ W["blk.0.ffn_gate.weight"].T, h @ W["blk.0.ffn_up.weight"].T
    x = x + (g / (1 + np.exp(-g)) * u) @ W["blk.0.ffn_down.weight"].T
    head = W["token_embd.weight"] if tied else W["output.weight"]
    return rms(x, W["output_norm.weight"]) @ head.T


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("tied", [False, True])
def test_forward_matches_numpy_reference(tmp_path, arch, tied):
    p, T, c = tiny_gguf(tmp_path, arch, tied=tied)
    m = load_model(p)
    assert m.tied == tied and m.hparams["rope_type"] == (2 if arch == "qwen3" else 0)
    tokens = np.array([3, 17, 5, 39, 0, 22, 22, 8, 1, 30, 12], np.int32)
    got = m.forward(tokens)
    want = np_forward(T, c, tokens, tied)
    assert got.shape == (len(tokens), c["V"])
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)
    assert np.array_equal(m.forward(tokens, first=4), got[4:])


def test_hand_checked_zero_residual(tmp_path):
    """With attn_output and ffn_down zero, the block adds nothing: the logits are
    rmsnorm(embedding) * out_norm times the head, which we compute by hand."""
    p, T, c = tiny_gguf(tmp_path, zero_residual=True)
    m = load_model(p)
    e = T["token_embd.weight"][7].astype(np.float64)
    hand = (e / np.sqrt(np.mean(e * e) + 1e-5) * T["output_norm.weight"]) @ T["output.weight"].T.astype(np.float64)
    got = m.forward(np.array([7, 7, 7]))
    for row in got:
        np.testing.assert_allclose(row, hand, rtol=1e-5, atol=1e-5)


def test_causality_and_thread_independence(tmp_path):
    p, T, c = tiny_gguf(tmp_path, "qwen3")
    m = load_model(p)
    a = m.forward(np.array([1, 2, 3, 4, 5, 6]), threads=1)
    b = m.forward(np.array([1, 2, 3, 9, 9, 9]), threads=3)
    assert np.array_equal(a[:3], b[:3])  # earlier positions never see later tokens
    assert not np.allclose(a[3:], b[3:])
    assert np.array_equal(a, m.forward(np.array([1, 2, 3, 4, 5, 6]), threads=2))


@pytest.mark.parametrize("path", ["int8", "nf4", "int4"])
def test_packed_paths_close_to_float(tmp_path, path):
    p, T, c = tiny_gguf(tmp_path)
    tokens = np.arange(12) % 40
    ref = load_model(p).forward(tokens)
    m = load_model(p, weights=path)
    assert set(m.paths.values()) == {path}
    got = m.forward(tokens)
    rel = np.abs(got - ref).mean() / np.abs(ref).mean()
    assert rel < (0.03 if path == "int8" else 0.3)
    assert not np.array_equal(got, ref)


def test_weights_dict_and_tiermap(tmp_path, shared):
    p, T, c = tiny_gguf(tmp_path)
    m = load_model(p, weights={"default": "int8", "output.weight": "fp32"})
    assert m.paths["output.weight"] == "fp32" and m.paths["blk.0.attn_q.weight"] == "int8"
    with pytest.raises(ValueError, match="not linear layers"):
        load_model(p, weights={"blk.0.attn_norm.weight": "int8"})
    with pytest.raises(ValueError, match="unknown weight path"):
        load_model(p, weights="int3")
    tm = orkpy.tier_map(shared / "models/stories260K/stories260K-Q4_0.gguf")
    m = load_model(shared / "models/stories260K/stories260K-F32.gguf", weights=tm)
    assert all(m.paths[n] == "int8" for n in m.paths if "ffn_down" in n)
    assert all(m.paths[n] == "nf4" for n in m.paths if "attn_q" in n)


def test_bad_input(tmp_path):
    p, T, c = tiny_gguf(tmp_path)
    m = load_model(p)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        m.forward(np.array([1, 40]))
    with pytest.raises(ValueError, match="first"):
        m.forward(np.array([1, 2]), first=2)
    with pytest.raises(ValueError, match="non-empty"):
        m.forward(np.array([], np.int32))
    bad = tmp_path / "bad.gguf"
    data, _ = build([kv("general.architecture", STRING, "gptj")], [])
    bad.write_bytes(data)
    with pytest.raises(ValueError, match="not supported"):
        load_model(bad)


def test_rope_scaling_from_metadata(tmp_path):
    assert load_model(_tiny_with(tmp_path, [])).hparams["rope_freq_scale"] == 1.0
    # linear scaling divides positions by the factor; yarn is refused, not ignored
    for typ, ok in (("linear", True), ("yarn", False)):
        extra = [kv("llama.rope.scaling.type", STRING, typ), kv("llama.rope.scaling.factor", FLOAT32, 4.0)]
        q = _tiny_with(tmp_path, extra)
        if ok:
            assert load_model(q).hparams["rope_freq_scale"] == 0.25
        else:
            with pytest.raises(NotImplementedError, match="yarn"):
                load_model(q)


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("key, vtype, value, shown", [
    ("llama.attention.layer_norm_rms_epsilon", FLOAT32, NAN, "nan"),
    ("llama.attention.layer_norm_rms_epsilon", FLOAT64, 1e39, "1e+39"),     # finite, but not as a float32
    ("llama.rope.freq_base", FLOAT32, NAN, "nan"),
    ("llama.rope.freq_base", FLOAT32, -INF, "-inf"),
    ("llama.rope.scaling.factor", FLOAT32, NAN, "nan"),
    ("llama.rope.scaling.factor", FLOAT32, INF, "inf"),
    ("llama.rope.scaling.factor", FLOAT32, 1e-45, "1.401298464324817e-45"),  # 1/factor overflows float32
    ("llama.rope.scale_linear", FLOAT32, NAN, "nan"),
    ("llama.rope.scaling.attn_factor", FLOAT32, INF, "inf"),
])
def test_non_finite_float_hparams_name_file_key_and_value(tmp_path, key, vtype, value, shown):
    """A NaN / Inf (or float32-overflowing) norm epsilon, RoPE base or RoPE scaling factor is a
    ValueError naming the file, the GGUF key and the value (it read "'norm_eps' = %g is not a finite
    float32": the value lost to CPython's formatter, neither file nor key named)."""
    p = _tiny_with(tmp_path, [kv(key, vtype, value)], eps=key != "llama.attention.layer_norm_rms_epsilon")
    with pytest.raises(ValueError) as e:
        load_model(p)
    msg = str(e.value)
    assert str(p) in msg and f"'{key}'" in msg and f"= {shown}" in msg, msg
    assert "%" not in msg, msg


@pytest.mark.parametrize("field, value, shown", [("norm_eps", NAN, "nan"), ("rope_base", -INF, "-inf"),
                                                 ("rope_freq_scale", 1e39, "1e+39")])
def test_core_hparam_error_keeps_the_value(field, value, shown):
    """The C door (hparams handed to _core.ForwardModel directly) formats the value in C."""
    import orkpy._core as C
    D, V = 8, 16
    rng = np.random.default_rng(0)
    lin = lambda n, k: ("f32", rng.standard_normal((n, k)).astype(np.float32))  # noqa: E731
    hp = dict(n_layer=1, n_embd=D, n_head=2, n_head_kv=2, head_dim=4, n_ff=8, n_vocab=V, n_rot=4,
              rope_type=0, rope_base=1e4, rope_freq_scale=1.0, norm_eps=1e-5)
    hp[field] = value
    layer = {"attn_norm": np.ones(D, np.float32), "ffn_norm": np.ones(D, np.float32), "attn_q": lin(D, D),
             "attn_k": lin(D, D), "attn_v": lin(D, D), "attn_output": lin(D, D), "ffn_gate": lin(8, D),
             "ffn_up": lin(8, D), "ffn_down": lin(D, 8)}
    with pytest.raises(ValueError) as e:
        C.ForwardModel(hp, rng.standard_normal((V, D)).astype(np.float32), np.ones(D, np.float32), lin(V, D), [layer])
    assert str(e.value) == f"'{field}' = {shown} is not a finite float32"


def _tiny_with(tmp_path, extra_kvs, eps=True):
    rng = np.random.default_rng(0)
    D, F, H, V = 8, 8, 2, 16
    T = {"token_embd.weight": rng.standard_normal((V, D)), "output_norm.weight": np.ones(D),
         "blk.0.attn_norm.weight": np.ones(D), "blk.0.ffn_norm.weight": np.ones(D),
         "blk.0.attn_q.weight": rng.standard_normal((D, D)), "blk.0.attn_k.weight": rng.standard_normal((D, D)),
         "blk.0.attn_v.weight": rng.standard_normal((D, D)), "blk.0.attn_output.weight": rng.standard_normal((D, D)),
         "blk.0.ffn_gate.weight": rng.standard_normal((F, D)), "blk.0.ffn_up.weight": rng.standard_normal((F, D)),
         "blk.0.ffn_down.weight": rng.standard_normal((D, F))}
    kvs = [kv("general.architecture", STRING, "llama"), kv("llama.block_count", UINT32, 1),
           kv("llama.embedding_length", UINT32, D), kv("llama.feed_forward_length", UINT32, F),
           kv("llama.attention.head_count", UINT32, H)]
    if eps:
        kvs.append(kv("llama.attention.layer_norm_rms_epsilon", FLOAT32, 1e-5))
    tensors = [(n, tuple(reversed(a.shape)), 0, a.astype(np.float32).tobytes()) for n, a in T.items()]
    data, _ = build(kvs + extra_kvs, tensors)
    p = tmp_path / f"scaled-{len(extra_kvs)}-{abs(hash(bytes(data))) % 10**8}.gguf"
    p.write_bytes(data)
    return p


# ------------------------------------------------ threads, bad input (stories260K) --
ST = "models/stories260K/stories260K-F32.gguf"


def test_forward_from_another_thread_while_imatrix_collects(shared):
    """A forward run from another thread while the model collects activation
    statistics, at a fixed point (the chunk iterator starts it between the second
    and third chunk and waits for it): its logits are those of an idle model, and
    the collection counts its rows too (docs/security.md), so the statistics equal
    a one-thread collection over chunks 1-2, that forward's tokens, chunks 3-4."""
    import threading
    m = orkpy.load_model(shared / ST)
    rng = np.random.default_rng(0)
    chunks = [rng.integers(3, 512, 64).astype(np.int32) for _ in range(4)]
    extra = rng.integers(3, 512, 256).astype(np.int32)
    idle = m.forward(extra, first=255, threads=1)
    seen = {}

    def chunks_with_a_forward_in_between():
        for i, c in enumerate(chunks):
            yield c
            if i == 1:
                t = threading.Thread(target=lambda: seen.setdefault("logits", m.forward(extra, first=255, threads=1)))
                t.start()
                t.join()
    got = m.collect_activation_stats(chunks_with_a_forward_in_between(), threads=1)
    assert np.array_equal(seen["logits"], idle)
    want = m.collect_activation_stats(chunks[:2] + [extra] + chunks[2:], threads=1)
    assert list(got) == list(want) and len(got) == 36
    assert want["blk.0.attn_q.weight"][1] == 4 * 64 + 256  # every position of every forward
    for name, (sums, count) in want.items():
        assert got[name][1] == count and np.array_equal(got[name][0], sums), name
    assert np.array_equal(m.forward(extra, first=255, threads=1), idle)  # collection off again


def test_forward_model_cannot_be_initialised_twice(shared):
    m = orkpy.load_model(shared / ST)
    with pytest.raises(RuntimeError, match="twice"):
        m._fwd.__init__({}, None, None, None, [])


def test_absurd_head_counts_refused(tmp_path):
    import orkpy._core as C
    D, V = 32, 16
    rng = np.random.default_rng(0)
    lin = lambda n, k: ("f32", rng.standard_normal((n, k)).astype(np.float32))  # noqa: E731
    hp = dict(n_layer=1, n_embd=D, n_head=2**62 + 8, n_head_kv=2**62 + 8, head_dim=4, n_ff=64, n_vocab=V, n_rot=4,
              rope_type=0, rope_base=1e4, rope_freq_scale=1.0, norm_eps=1e-5)
    layer = {"attn_norm": np.ones(D, np.float32), "ffn_norm": np.ones(D, np.float32), "attn_q": lin(D, D),
             "attn_k": lin(D, D), "attn_v": lin(D, D), "attn_output": lin(D, D), "ffn_gate": lin(64, D),
             "ffn_up": lin(64, D), "ffn_down": lin(D, 64)}
    with pytest.raises(ValueError, match="out of range"):
        C.ForwardModel(hp, rng.standard_normal((V, D)).astype(np.float32), np.ones(D, np.float32), lin(V, D), [layer])


def test_token_ids_are_checked(shared):
    m = orkpy.load_model(shared / ST)
    with pytest.raises(ValueError, match="out of range"):
        m.forward([1, 2**32 + 3, 5])
    with pytest.raises(TypeError, match="integers"):
        m.forward(np.array([1.0, 3.99]))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        orkpy.evaluation.ppl.tokens_for_ppl(m, np.array([3, 600]))


def test_add_bos_false_is_honoured(shared):
    m = orkpy.load_model(shared / ST)
    text = "Once upon a time there was a little dog. " * 60
    a = orkpy.perplexity(m, text, n_ctx=64, add_bos=False, progress=False)
    b = orkpy.perplexity(m, m.tokenizer.encode(text, add_special=False), n_ctx=64, add_bos=False, progress=False)
    assert a.ppl == b.ppl and a.n_tokens == b.n_tokens


def test_vnni_matmul_table_is_bit_identical_to_avx2(shared, monkeypatch):
    """The int8 strip GEMM's AVX-512 VNNI table (chosen under "avx2" where the CPU has
    avx512vl + avx512vnni; ORKPY_NO_VNNI=1 keeps the plain one) gives the same logits
    bit for bit on the int8 and nf4 paths, at prefill sizes (4-row blocks + tails)."""
    caps = orkpy.capabilities()
    if "avx2" not in caps["available"]:
        pytest.skip("no AVX2 here")
    tokens = np.arange(1, 40, dtype=np.int32)  # 39 rows: nine 4-row blocks and a 3-row tail
    with orkpy.use_isa("avx2"):
        vnni = orkpy.capabilities()["cpu_features"]["avx512vnni"]
        assert orkpy.capabilities()["matmul_kernels"] == ("avx2vnni" if vnni else "avx2")
        for weights in ("int8", "nf4"):
            m = load_model(shared / ST, weights=weights)
            monkeypatch.delenv("ORKPY_NO_VNNI", raising=False)
            a = m.forward(tokens, threads=2)
            monkeypatch.setenv("ORKPY_NO_VNNI", "1")
            assert orkpy.capabilities()["matmul_kernels"] == "avx2"
            b = m.forward(tokens, threads=1)
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), weights
    print(f"\navx512vnni on this CPU: {vnni} (False: both runs took the plain AVX2 table)")


def test_nll_rows_against_float64_and_thread_count():
    """nll_rows (perplexity's per-token NLL): float64 log-softmax within float rounding, the same
    bits on 1 and 2 threads (each row one thread's sum), a target outside the vocabulary named, a
    negative thread count refused like forward's."""
    from orkpy import _core
    rng = np.random.default_rng(7)
    logits = (rng.standard_normal((37, 5003)) * 4).astype(np.float32)
    targets = rng.integers(0, 5003, 37).astype(np.int32)
    l64 = logits.astype(np.float64)
    mx = l64.max(1, keepdims=True)
    want = -(l64[np.arange(37), targets] - mx[:, 0] - np.log(np.exp(l64 - mx).sum(1)))
    got = _core.nll_rows(logits, targets, 2)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert np.array_equal(got, _core.nll_rows(logits, targets, 1))
    assert np.array_equal(got, _core.nll_rows(logits, targets))
    bad = targets.copy()
    bad[5] = 5003
    with pytest.raises(ValueError, match="target 5003 of row 5 is outside the vocabulary"):
        _core.nll_rows(logits, bad, 2)
    with pytest.raises(ValueError, match="threads must be >= 0"):
        _core.nll_rows(logits, targets, -5)


def test_forward_into_out(shared):
    """forward(out=buf) writes the same logits into buf and returns it; a wrong buffer is refused
    by name before any work."""
    m = load_model(shared / "models/stories260K/stories260K-F32.gguf")
    ids = np.arange(1, 41, dtype=np.int32)
    want = m.forward(ids, first=10)
    buf = np.full((30, m.n_vocab), np.nan, np.float32)
    got = m.forward(ids, first=10, out=buf)
    assert got is buf and np.array_equal(buf, want)
    with pytest.raises(ValueError, match=r"out must have shape \(30, 512\)"):
        m.forward(ids, first=10, out=np.empty((31, m.n_vocab), np.float32))
    for bad in (np.empty((30, m.n_vocab), np.float64), np.empty((m.n_vocab, 30), np.float32).T, [[0.0]]):
        with pytest.raises(TypeError, match="out must be a writeable C-contiguous float32 ndarray"):
            m.forward(ids, first=10, out=bad)
    ro = np.empty((30, m.n_vocab), np.float32)
    ro.flags.writeable = False
    with pytest.raises(TypeError, match="writeable"):
        m.forward(ids, first=10, out=ro)


def test_resident_workers_survive_fork_and_concurrent_callers(shared):
    """The pool's resident workers (pool.c): a forked child gets a fresh pool and still runs a
    2-thread pass (same bits), and passes from several Python threads at once (one holds the
    workers, the others start their own threads) give the same bits as one alone."""
    import os
    import signal
    import threading
    m = load_model(shared / "models/stories260K/stories260K-F32.gguf")
    ids = np.arange(1, 65, dtype=np.int32)
    want = m.forward(ids, threads=2)          # starts the resident worker
    pid = os.fork()
    if pid == 0:                              # the child: no workers survived the fork
        signal.alarm(60)                      # a hang fails the test instead of blocking it
        ok = False
        try:
            ok = np.array_equal(m.forward(ids, threads=2), want)
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    got = [None] * 4

    def run(i):
        got[i] = m.forward(ids, threads=2)
    ts = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert all(g is not None and np.array_equal(g, want) for g in got)


def test_huge_thread_counts_give_the_same_bits(shared):
    """threads far past the cores (here up to 16 attention items run at once on 2 cores, and the
    linears' pool clips at 256 threads) give the same bits as 2."""
    m = load_model(shared / "models/stories260K/stories260K-F32.gguf")
    ids = (np.arange(512, dtype=np.int32) * 7 + 1) % m.n_vocab
    assert np.array_equal(m.forward(ids, threads=100000), m.forward(ids, threads=2))
