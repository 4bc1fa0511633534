"""Small synthetic models of every architecture in orkpy's table, written with orkpy's own
GGUF writer, and a float64 NumPy forward pass written from llama.cpp's graphs
(src/models/<arch>.cpp), independent of orkpy.formats.arch: the tests hold the C forward pass to it,
and hold both to the live llama.cpp (tests/test_arch_oracle.py).

Weights are random with realistic outliers: a few embedding channels 10x larger (the
residual stream's massive activations), norm gains with a few large entries, a few input
columns of every linear 4x larger. The tokenizer metadata is stories260K's (a 512-token
SentencePiece vocabulary), so llama.cpp loads every file; no tokenizer is needed for logits.
"""
import os
import pathlib

import numpy as np

from orkpy.formats.gguf_write import metadata_triples, write_gguf

SHARED = pathlib.Path(os.environ.get("ORKPY_SHARED", pathlib.Path(__file__).resolve().parents[2] / "shared"))
STORIES = SHARED / "models" / "stories260K" / "stories260K-F32.gguf"
N_VOCAB = 512

# the facts per architecture, as llama.cpp's graphs have them (see orkpy/formats/arch.py for the sources)
FACTS = {
    "llama": dict(neox=False, gate_fn="silu", qk_norm=False, post=False, embd_scale=False, gemma_scale=False),
    "qwen2": dict(neox=True, gate_fn="silu", qk_norm=False, post=False, embd_scale=False, gemma_scale=False),
    "qwen3": dict(neox=True, gate_fn="silu", qk_norm=True, post=False, embd_scale=False, gemma_scale=False),
    "gemma": dict(neox=True, gate_fn="gelu", qk_norm=False, post=False, embd_scale=True, gemma_scale=False),
    "gemma2": dict(neox=True, gate_fn="gelu", qk_norm=False, post=True, embd_scale=True, gemma_scale=True),
    "gemma3": dict(neox=True, gate_fn="gelu", qk_norm=True, post=True, embd_scale=True, gemma_scale=True),
    "phi3": dict(neox=True, gate_fn="silu", qk_norm=False, post=False, embd_scale=False, gemma_scale=False),
}


def vocab_metadata():
    """stories260K's tokenizer.* metadata triples (a vocabulary llama.cpp accepts)."""
    return [t for t in metadata_triples(str(STORIES)) if t[0].startswith("tokenizer.")]


def make(arch, path, *, seed=0, n_layer=3, D=64, H=4, HKV=2, hd=None, F=96, n_ctx=2048, rope_base=10000.0,
         n_swa=None, pattern=None, rope_base_swa=None, attn_softcap=None, final_softcap=None, qkv_bias=None,
         output_bias=False, tied=False, rope_freqs=False, fused_qkv=None, ffn_bias=False, longrope=None,
         extra=(), dtype=np.float32, scale=1.0, converter_keys=False, n_rot=None):
    """Write a synthetic ``arch`` model to ``path``; returns (tensors {name: float32 array as
    written}, cfg: the facts the reference forward pass needs). ``longrope``: (original context,
    attn_factor) adds LongRoPE short/long factor tensors; ``extra``: more (name, array) tensors;
    ``converter_keys``: no ``rope.freq_base`` / ``rope.dimension_count`` (as llama.cpp's Gemma
    converter writes it: both readers take their defaults, 10000 and the head size); ``n_rot``: the
    ``rope.dimension_count`` written (default the head size; the reference forward pass assumes that)."""
    rng = np.random.default_rng(seed)
    f = FACTS[arch]
    hd = hd or D // H
    qd, kvd = H * hd, HKV * hd
    qkv_bias = (arch == "qwen2") if qkv_bias is None else qkv_bias
    fused_qkv = (arch == "phi3") if fused_qkv is None else fused_qkv
    tied = True if arch in ("gemma", "gemma2") else tied  # llama.cpp never loads their output.weight

    def lin(N, K, s=0.3):
        w = rng.standard_normal((N, K)) * s / np.sqrt(K / 64) * scale
        w[:, rng.choice(K, max(1, K // 32), replace=False)] *= 4.0  # outlier input columns
        return w

    def gain(n):
        g = 1 + 0.1 * rng.standard_normal(n)
        g[rng.choice(n, 2, replace=False)] *= 3.0
        return g

    T = {}
    emb = rng.standard_normal((N_VOCAB, D))
    emb[:, rng.choice(D, 3, replace=False)] *= 10.0  # massive residual channels
    T["token_embd.weight"] = emb * (0.1 if f["embd_scale"] else 1.0)
    T["output_norm.weight"] = gain(D)
    if not tied:
        T["output.weight"] = lin(N_VOCAB, D)
    if output_bias:
        T["output.bias"] = 0.5 * rng.standard_normal(N_VOCAB)
    if rope_freqs:
        T["rope_freqs.weight"] = np.exp(rng.uniform(0, 2, hd // 2))  # llama3-style divisors >= 1
    if longrope:
        T["rope_factors_short.weight"] = np.exp(rng.uniform(0, 1, hd // 2))
        T["rope_factors_long.weight"] = np.exp(rng.uniform(1, 3, hd // 2))
    for i in range(n_layer):
        p = f"blk.{i}."
        T[p + "attn_norm.weight"] = gain(D)
        q, k, v = lin(qd, D), lin(kvd, D), lin(kvd, D)
        if fused_qkv:
            T[p + "attn_qkv.weight"] = np.concatenate([q, k, v])
        else:
            T[p + "attn_q.weight"], T[p + "attn_k.weight"], T[p + "attn_v.weight"] = q, k, v
        if qkv_bias:
            bq, bk, bv = (0.3 * rng.standard_normal(n) for n in (qd, kvd, kvd))
            if fused_qkv:
                T[p + "attn_qkv.bias"] = np.concatenate([bq, bk, bv])
            else:
                T[p + "attn_q.bias"], T[p + "attn_k.bias"], T[p + "attn_v.bias"] = bq, bk, bv
        if f["qk_norm"]:
            T[p + "attn_q_norm.weight"], T[p + "attn_k_norm.weight"] = gain(hd), gain(hd)
        T[p + "attn_output.weight"] = lin(D, qd)
        T[p + "ffn_norm.weight"] = gain(D)
        gate, up = lin(F, D), lin(F, D)
        if arch == "phi3":
            T[p + "ffn_up.weight"] = np.concatenate([gate, up])  # gate first (ggml_swiglu, not swapped)
        else:
            T[p + "ffn_gate.weight"], T[p + "ffn_up.weight"] = gate, up
        T[p + "ffn_down.weight"] = lin(D, F)
        if ffn_bias:
            T[p + "attn_output.bias"] = 0.3 * rng.standard_normal(D)
            T[p + "ffn_gate.bias"], T[p + "ffn_up.bias"] = (0.3 * rng.standard_normal(F) for _ in range(2))
            T[p + "ffn_down.bias"] = 0.3 * rng.standard_normal(D)
        if f["post"]:
            T[p + "post_attention_norm.weight"], T[p + "post_ffw_norm.weight"] = gain(D), gain(D)
    T.update(dict(extra))
    T = {k: np.asarray(v, dtype=dtype if v.ndim > 1 else np.float32) for k, v in T.items()}

    # (a name containing "phi3" would make llama.cpp look for Phi-3's special tokens)
    md = [("general.architecture", "STRING", arch), ("general.name", "STRING", "orkpy synthetic")]
    a = arch
    md += [(f"{a}.block_count", "UINT32", n_layer), (f"{a}.context_length", "UINT32", n_ctx),
           (f"{a}.embedding_length", "UINT32", D), (f"{a}.feed_forward_length", "UINT32", F),
           (f"{a}.attention.head_count", "UINT32", H), (f"{a}.attention.head_count_kv", "UINT32", HKV),
           (f"{a}.attention.key_length", "UINT32", hd), (f"{a}.attention.value_length", "UINT32", hd),
           (f"{a}.rope.dimension_count", "UINT32", hd if n_rot is None else n_rot),
           (f"{a}.rope.freq_base", "FLOAT32", rope_base),
           (f"{a}.attention.layer_norm_rms_epsilon", "FLOAT32", 1e-6)]
    if converter_keys:
        assert rope_base == 10000.0, "converter_keys: the RoPE base is the readers' default"
        md = [t for t in md if t[0] not in (f"{a}.rope.dimension_count", f"{a}.rope.freq_base")]
    if n_swa is not None:
        md.append((f"{a}.attention.sliding_window", "UINT32", n_swa))
    if pattern is not None:
        md.append((f"{a}.attention.sliding_window_pattern", "UINT32", pattern))
    if rope_base_swa is not None:
        md.append((f"{a}.rope.freq_base_swa", "FLOAT32", rope_base_swa))
    if attn_softcap is not None:
        md.append((f"{a}.attn_logit_softcapping", "FLOAT32", attn_softcap))
    if final_softcap is not None:
        md.append((f"{a}.final_logit_softcapping", "FLOAT32", final_softcap))
    if longrope:
        md += [(f"{a}.rope.scaling.type", "STRING", "longrope"),
               (f"{a}.rope.scaling.original_context_length", "UINT32", longrope[0]),
               (f"{a}.rope.scaling.attn_factor", "FLOAT32", longrope[1])]
    md += vocab_metadata()
    write_gguf(path, md, list(T.items()))

    # the reference's facts, from llama.cpp's graphs
    swa_layers = []
    if arch in ("gemma2", "gemma3"):
        window = n_swa if n_swa is not None else (4096 if arch == "gemma2" else 0)
        p = pattern if pattern is not None else (2 if arch == "gemma2" else 6)
        if window:
            swa_layers = [i for i in range(n_layer) if p == 0 or i % p < p - 1]
    else:
        window = 0
    base_swa = rope_base_swa if rope_base_swa is not None else (10000.0 if arch == "gemma3" else rope_base)
    cfg = dict(arch=arch, n_layer=n_layer, D=D, H=H, HKV=HKV, hd=hd, F=F, eps=1e-6, neox=f["neox"], gate_fn=f["gate_fn"],
               qk_norm=f["qk_norm"], post=f["post"], embd_scale=np.sqrt(np.float32(D)) if f["embd_scale"] else 1.0,
               attn_scale=1 / np.sqrt(hd), n_swa=window, swa_layers=swa_layers,
               rope_base=[base_swa if i in swa_layers else rope_base for i in range(n_layer)],
               attn_softcap=(attn_softcap if attn_softcap is not None else 50.0) if arch == "gemma2" else 0.0,
               final_softcap=(final_softcap if final_softcap is not None else 30.0) if arch == "gemma2"
               else (final_softcap or 0.0) if arch == "gemma3" else 0.0,
               tied=tied, rope_attn_factor=longrope[1] if longrope else 1.0)
    return T, cfg


class _Float64(dict):
    """T's tensors as float64, each converted when first used."""

    def __init__(self, T):
        super().__init__()
        self.T = T

    def __contains__(self, k):
        return k in self.T

    def __getitem__(self, k):
        if not dict.__contains__(self, k):
            self[k] = np.asarray(self.T[k], np.float64)
        return dict.__getitem__(self, k)

    def get(self, k, default=None):
        return self[k] if k in self.T else default


def gelu_ggml_f16(z):
    """llama.cpp's CPU GELU (ggml-cpu/vec.h, GGML_GELU_FP16): for -10 < x < 10 the input rounded
    to fp16, looked up in a table of fp16-rounded float32 gelu values; else 0 / x."""
    x = np.asarray(z, np.float32)
    h = x.astype(np.float16).astype(np.float32)
    c, a, half, one = np.float32(0.7978845608028654), np.float32(0.044715), np.float32(0.5), np.float32(1)
    g = (half * h * (one + np.tanh(c * h * (one + a * h * h)))).astype(np.float16).astype(np.float64)
    return np.where(x <= -10, 0.0, np.where(x >= 10, np.asarray(z, np.float64), g))


def ref_forward(T, c, tokens, gelu=None):
    """float64 logits (len(tokens), n_vocab) of the model (T, c) -- llama.cpp's graph, written out
    (``gelu``: another GELU, e.g. :func:`gelu_ggml_f16`; default the exact tanh form)."""
    W = _Float64(T)
    n, H, HKV, hd, D, F = len(tokens), c["H"], c["HKV"], c["hd"], c["D"], c["F"]
    qd, kvd = H * hd, HKV * hd

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + c["eps"]) * w

    def rope(v, base):  # v (n, heads, hd)
        ff = W.get("rope_freqs.weight", W.get("rope_factors_short.weight", np.ones(hd // 2)))
        mscale = float(np.float32(c["rope_attn_factor"]))
        out = v.copy()
        pos = np.arange(n)[:, None]
        for i in range(hd // 2):
            th = pos * base ** (-2 * i / hd) / ff[i]
            a, b = (i, i + hd // 2) if c["neox"] else (2 * i, 2 * i + 1)
            cs, sn = np.cos(th) * mscale, np.sin(th) * mscale
            out[..., a] = v[..., a] * cs - v[..., b] * sn
            out[..., b] = v[..., a] * sn + v[..., b] * cs
        return out

    def gate_fn(z):
        if c["gate_fn"] == "gelu" and gelu is not None:
            return gelu(z)
        if c["gate_fn"] == "gelu":
            return 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3)))
        return z / (1 + np.exp(-z))

    x = W["token_embd.weight"][tokens] * float(c["embd_scale"])
    for i in range(c["n_layer"]):
        p = f"blk.{i}."
        h = rms(x, W[p + "attn_norm.weight"])
        if p + "attn_qkv.weight" in W:
            qkv = h @ W[p + "attn_qkv.weight"].T + W.get(p + "attn_qkv.bias", 0.0)
            q, k, v = qkv[:, :qd], qkv[:, qd:qd + kvd], qkv[:, qd + kvd:]
        else:
            q, k, v = (h @ W[p + f"attn_{s}.weight"].T + W.get(p + f"attn_{s}.bias", 0.0) for s in "qkv")
        q, k, v = q.reshape(n, H, hd), k.reshape(n, HKV, hd), v.reshape(n, HKV, hd)
        if c["qk_norm"]:
            q, k = rms(q, W[p + "attn_q_norm.weight"]), rms(k, W[p + "attn_k_norm.weight"])
        q, k = rope(q, c["rope_base"][i]), rope(k, c["rope_base"][i])
        rep = H // HKV
        s = np.einsum("thd,uhd->htu", q, np.repeat(k, rep, axis=1)) * c["attn_scale"]
        if c["attn_softcap"]:
            s = np.tanh(s / c["attn_softcap"]) * c["attn_softcap"]
        t_idx, u_idx = np.arange(n)[:, None], np.arange(n)[None, :]
        mask = u_idx > t_idx
        if i in c["swa_layers"]:
            mask |= (t_idx - u_idx) >= c["n_swa"]
        s = np.where(mask, -np.inf, s)
        pr = np.exp(s - s.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        o = np.einsum("htu,uhd->thd", pr, np.repeat(v, rep, axis=1)).reshape(n, qd)
        o = o @ W[p + "attn_output.weight"].T + W.get(p + "attn_output.bias", 0.0)
        if c["post"]:
            o = rms(o, W[p + "post_attention_norm.weight"])
        x = x + o
        h = rms(x, W[p + "ffn_norm.weight"])
        if p + "ffn_gate.weight" in W:
            g = h @ W[p + "ffn_gate.weight"].T + W.get(p + "ffn_gate.bias", 0.0)
            u = h @ W[p + "ffn_up.weight"].T + W.get(p + "ffn_up.bias", 0.0)
        else:
            gu = h @ W[p + "ffn_up.weight"].T
            g, u = gu[:, :F], gu[:, F:]
        y = (gate_fn(g) * u) @ W[p + "ffn_down.weight"].T + W.get(p + "ffn_down.bias", 0.0)
        if c["post"]:
            y = rms(y, W[p + "post_ffw_norm.weight"])
        x = x + y
    head = W["token_embd.weight"] if c["tied"] else W["output.weight"]
    logits = rms(x, W["output_norm.weight"]) @ head.T + W.get("output.bias", 0.0)
    if c["final_softcap"]:
        logits = np.tanh(logits / c["final_softcap"]) * c["final_softcap"]
    return logits


def tokens(n, seed=0):
    """n token ids drawn from the 512-token vocabulary (no BOS), reproducible."""
    return np.random.default_rng(seed + 100).integers(3, N_VOCAB, n).astype(np.int32)


def log_softmax(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def compare(ours, ref):
    """(max |logit diff|, max |diff| / std of the reference logits, mean KL(ref || ours) in nats)."""
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    d = float(np.abs(ours - ref).max())
    lr, lo = log_softmax(ref), log_softmax(ours)
    kl = float((np.exp(lr) * (lr - lo)).sum(-1).mean())
    return d, d / float(ref.std()), kl
