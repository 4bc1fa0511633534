"""A small seeded synthetic Llama-layout model that orkpy generates itself,
so the end-to-end gate runs on a fresh machine with no model. Its weights are
random (with a few x20 input channels, like real outlier channels, and norm
gains that make a few activation channels 8x larger, as real models' do): its
perplexity means nothing; it proves the pipeline.

``make_synthetic(dirpath, seed=0)`` writes:
  - ``synthetic-F16.gguf``: the fp16 source, architecture ``llama``, a byte-
    level SentencePiece vocabulary (every byte is a token, plus frequent
    letter pairs), 4 blocks of width 128;
  - ``synthetic-alloc.map``: an emit-map allocation following llama.cpp's
    Q4_K_M rule (attn_v and ffn_down of the first/last eighth and every third
    block get int8, everything else int4);
  - ``synthetic-text.txt``: seeded pseudo-English text (evaluation);
  - ``synthetic-calib.txt``: the same generator with another seed
    (``seed + CALIB_SEED_OFFSET``): the calibration text, never scored.

The same arguments give byte-identical files in every process (nothing
depends on the interpreter's hash seed).
"""
import os

import numpy as np

from ..formats.tiermap import TierEntry, TierMap, use_more_bits

CALIB_SEED_OFFSET = 1000
WORDS = ("the a an cat dog bird tree house little big red blue happy sad ran jumped saw found said "
         "was is and but then so when they she he it day night sun moon played looked went home").split()


def synthetic_text(n_words=16000, seed=0):
    rng = np.random.default_rng(seed)
    out, sent = [], []
    for i in range(n_words):
        w = WORDS[int(rng.zipf(1.6)) % len(WORDS)]
        sent.append(w)
        if len(sent) > 4 and rng.random() < 0.15:
            s = " ".join(sent)
            out.append(s[0].upper() + s[1:] + ".")
            sent = []
    return " ".join(out) + "\n"


def _vocab():
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    pieces = ["\u2581"] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + [c.upper() for c in "abcdefghijklmnopqrstuvwxyz"]
    pieces += [".", ","] + ["\u2581" + w for w in WORDS] + [w[:2] for w in WORDS]
    seen = set(toks)
    for p in pieces:  # a list in a fixed order: the vocabulary never depends on the hash seed
        if p not in seen:
            seen.add(p)
            toks.append(p)
            types.append(1)
    scores = np.zeros(len(toks), np.float32)
    for i in range(259, len(toks)):
        scores[i] = -float(i) if len(toks[i]) < 3 else float(len(toks[i]))  # longer pieces merge first
    return toks, scores, np.array(types, np.int32)


def make_synthetic(dirpath, seed=0, n_layer=4, n_embd=128, n_ff=352, n_head=4, n_head_kv=2):
    from ..formats.gguf_write import write_gguf

    os.makedirs(dirpath, exist_ok=True)
    rng = np.random.default_rng(seed)
    toks, scores, types = _vocab()
    V = ((len(toks) + 31) // 32) * 32
    while len(toks) < V:
        toks.append(f"<pad{len(toks)}>")
        types = np.append(types, 5).astype(np.int32)
        scores = np.append(scores, np.float32(-1e9)).astype(np.float32)
    hd = n_embd // n_head
    meta = [("general.architecture", "STRING", "llama"), ("general.name", "STRING", "orkpy synthetic"),
            ("llama.block_count", "UINT32", n_layer), ("llama.context_length", "UINT32", 512),
            ("llama.embedding_length", "UINT32", n_embd), ("llama.feed_forward_length", "UINT32", n_ff),
            ("llama.attention.head_count", "UINT32", n_head), ("llama.attention.head_count_kv", "UINT32", n_head_kv),
            ("llama.rope.dimension_count", "UINT32", hd),
            ("llama.attention.layer_norm_rms_epsilon", "FLOAT32", 1e-5),
            ("general.file_type", "UINT32", 1),
            ("tokenizer.ggml.model", "STRING", "llama"), ("tokenizer.ggml.tokens", "ARRAY", toks),
            ("tokenizer.ggml.scores", "ARRAY", scores), ("tokenizer.ggml.token_type", "ARRAY", types),
            ("tokenizer.ggml.bos_token_id", "UINT32", 1), ("tokenizer.ggml.eos_token_id", "UINT32", 2),
            ("tokenizer.ggml.unknown_token_id", "UINT32", 0)]
    outlier = rng.random(max(n_embd, n_ff)) < 0.01

    def w(N, K, std=0.05):
        a = rng.standard_normal((N, K)) * std
        a[:, outlier[:K]] *= 20
        return a.astype(np.float16)

    # salient activation channels, as real models' norm gains make them: a few inputs of every linear that the
    # norms feed run 8x larger than the rest (what an imatrix is for)
    gain = np.where(rng.random(n_embd) < 0.05, 8.0, 1.0).astype(np.float32)
    tensors = [("token_embd.weight", (rng.standard_normal((V, n_embd)) * 0.05).astype(np.float16)),
               ("output_norm.weight", np.ones(n_embd, np.float32))]
    entries = {"token_embd.weight": TierEntry("int8", "Q6_K", (V, n_embd))}
    for i in range(n_layer):
        p = f"blk.{i}."
        shapes = {"attn_q": (n_embd, n_embd), "attn_k": (n_head_kv * hd, n_embd), "attn_v": (n_head_kv * hd, n_embd),
                  "attn_output": (n_embd, n_embd), "ffn_gate": (n_ff, n_embd), "ffn_up": (n_ff, n_embd),
                  "ffn_down": (n_embd, n_ff)}
        tensors += [(p + "attn_norm.weight", gain.copy()), (p + "ffn_norm.weight", gain.copy())]
        for t, shp in shapes.items():
            tensors.append((p + t + ".weight", w(*shp)))
            more = t in ("attn_v", "ffn_down") and use_more_bits(i, n_layer)
            entries[p + t + ".weight"] = TierEntry("int8" if more else "int4", "Q6_K" if more else "Q4_K", shp)
        entries[p + "attn_norm.weight"] = TierEntry("float", "F32", (n_embd,))
        entries[p + "ffn_norm.weight"] = TierEntry("float", "F32", (n_embd,))
    entries["output_norm.weight"] = TierEntry("float", "F32", (n_embd,))
    paths = {k: os.path.join(dirpath, f) for k, f in
             (("model", "synthetic-F16.gguf"), ("alloc", "synthetic-alloc.map"), ("text", "synthetic-text.txt"),
              ("calib", "synthetic-calib.txt"))}
    write_gguf(paths["model"], meta, tensors)
    TierMap(entries, threshold=5.0, source="synthetic (llama.cpp Q4_K_M rule)", tied=True).save(paths["alloc"])
    from .._io import atomic_write
    atomic_write(paths["text"], [synthetic_text(seed=seed).encode()])
    atomic_write(paths["calib"], [synthetic_text(seed=seed + CALIB_SEED_OFFSET).encode()])
    return paths
