"""Synthetic vocabularies (byte-level BPE, SentencePiece) for the tokenizer oracle tests (issue 15).

``write_bpe_vocab(path, pre, bpe_vocab(pre, texts, n_merges))`` trains GPT-2-style byte-level
BPE merges on ``texts`` split by the pre-tokenizer ``pre`` itself (so the merges follow
that pre-tokenizer's word boundaries: digit groups, contractions, case splits, ...)
and writes a vocabulary-only GGUF with orkpy's writer: architecture ``llama`` with
the few hyper-parameters llama.cpp reads even for a vocabulary-only load, no tensors.

The vocabulary: the 256 GPT-2 byte characters, one token per merge, then
``EXTRA_WORDS`` frequent words the merges did not reach (tokens BPE can never
produce, so only ``ignore_merges`` pre-tokenizers emit them), the control tokens
``<|endoftext|>`` (BOS and EOS) and ``<|im_start|>``, and the user-defined token
``@-@`` (split out of raw text before pre-tokenization; wikitext is full of it).
``add_bos_token`` is left out, so each pre-tokenizer's own default applies.

``write_spm_vocab(path, spm_vocab(texts, n_merges, add_space_prefix), add_space_prefix, name)``
writes a SentencePiece-style ("llama") vocabulary: ``<unk> <s> </s>``, the 256 ``<0xXX>``
byte tokens, every character of the training text, then pieces merged across
word boundaries (trained on pairs of words, so tokens such as ``"\u2581of\u2581the"``
or ``".\n"`` exist and the tokenizer's cut-at-"\u2581" speed-up is exercised),
whitespace-run tokens (``"\u2581\u2581"``, ``"\n\n"``, ...), scores = -rank (many
ties), the user-defined ``@-@`` and ``<|user|>``, and ``<|end|>`` typed
user-defined (llama.cpp makes it control by its text) plus the control tokens a
phi-3 name requires. Training is deterministic (ties broken by the pair's text)."""
import collections
import heapq

import numpy as np

import orkpy
from orkpy.runtime.tokenizer import _BYTE_TO_CHAR, Tokenizer

EXTRA_WORDS = 48
USER_DEFINED = "@-@"

# lines mixed into the training text so that merges also cover what the tricky-string tests
# throw at the pre-tokenizers (letters of several scripts, digits, marks, whitespace runs)
TRICKY = [
    "I'm sure it's what we'd've DON'T they'LL You'Re she'S HE'd",
    "numbers 1234567 3.14159 and 10,000 -42 +7 0x1F 1e10 \u0661\u0662\u0663 \u00bd \u2460",
    "caf\u00e9 na\u00efve \u00fcber \u0141\u00f3d\u017a \u00c9COLE \u00c5ngstr\u00f6m \u0130stanbul stra\u00dfe",
    "\u4f60\u597d\uff0c\u4e16\u754c\u3002\u3053\u3093\u306b\u3061\u306f \u30ab\u30bf\u30ab\u30ca \ud55c\uad6d\uc5b4 "
    "\u0420\u0443\u0441\u0441\u043a\u0438\u0439 \u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac",
    "emoji \U0001F600\U0001F44D\U0001F3FD and \u2764\ufe0f family \U0001F468\u200d\U0001F469\u200d\U0001F467",
    "Tabs\tand\nnewlines\n\n\r\nand CRLF\r\n   three spaces  two\u00a0nbsp\u3000ideographic\u2003em",
    "combining e\u0301 a\u0308 \u0928\u092e\u0938\u094d\u0924\u0947 "
    "\u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u05e2\u05d1\u05e8\u05d9\u05ea",
    "punctuation!!! ??? ... --- (a) [b] {c} <d> $5 ~tilde ^caret |pipe` 'quoted' \"double\" @-@ path/to/file.txt",
    "CamelCaseWords HTTPServer iPhone XMLHttpRequest snake_case_name UPPER lower MiXeD",
    # Unicode 15.0/15.1 letters and digits (unknown to Python 3.11's unicodedata), 16.0 ones (unassigned
    # for llama.cpp, letters/digits for a recent `regex`), C0 separators (str.isspace(), not llama.cpp's
    # whitespace), NEL (whitespace), zero-width characters
    "probes k\U00011f04\U00011f05m 12\U00011f50\U00011f51 \U0002ebf0\U0002ebf1z a\u1c89\u1c8ab "
    "x\U00016d70\U00016d71y fs\x1c\x1dgs nel\x85x zw\u200bsp bom\ufeffx",
]


def _pair_counts(words):
    counts, where = collections.Counter(), collections.defaultdict(set)
    for i, (syms, n) in enumerate(words):
        for a, b in zip(syms, syms[1:]):
            counts[(a, b)] += n
            where[(a, b)].add(i)
    return counts, where


def train_merges(word_counts, n_merges):
    """BPE training: ``word_counts`` maps words (sequences of base symbols) to counts; returns
    the merges "a b", most frequent pair first (ties: the smaller pair)."""
    words = [(list(w), n) for w, n in sorted(word_counts.items())]
    counts, where = _pair_counts(words)
    heap = [(-n, p) for p, n in counts.items()]
    heapq.heapify(heap)
    merges = []
    while heap and len(merges) < n_merges:
        n, pair = heapq.heappop(heap)
        if -n != counts.get(pair, 0) or n == 0:
            continue   # stale entry
        merges.append(pair)
        a, b = pair
        ab = a + b
        touched = set()
        for i in sorted(where.pop(pair, ())):
            syms, cnt = words[i]
            hit = [k for k in range(len(syms) - 1) if syms[k] == a and syms[k + 1] == b]
            if not hit:
                continue   # the word lost this pair to an earlier merge
            for x, y in zip(syms, syms[1:]):
                counts[(x, y)] -= cnt
                touched.add((x, y))
            out, k = [], 0
            while k < len(syms):
                if k + 1 < len(syms) and syms[k] == a and syms[k + 1] == b:
                    out.append(ab)
                    k += 2
                else:
                    out.append(syms[k])
                    k += 1
            words[i] = (out, cnt)
            for x, y in zip(out, out[1:]):
                counts[(x, y)] += cnt
                where[(x, y)].add(i)
                touched.add((x, y))
        counts.pop(pair, None)
        for q in touched:
            c = counts.get(q, 0)
            if c > 0:
                heapq.heappush(heap, (-c, q))
            else:
                counts.pop(q, None)
    return [f"{a} {b}" for a, b in merges]


def bpe_vocab(pre, texts, n_merges, tricky=20):
    """(tokens, token types, merges) trained on ``texts`` + ``tricky`` times TRICKY, split by ``pre``."""
    splitter = Tokenizer(model="gpt2", tokens=list(_BYTE_TO_CHAR), merges=[], pre=pre)
    to_chars = {b: c for b, c in enumerate(_BYTE_TO_CHAR)}
    word_counts = collections.Counter()
    for text in list(texts) + TRICKY * tricky:
        for frag in text.split(USER_DEFINED):
            for w in splitter._pretokenize(frag):
                word_counts[w.encode("utf-8").decode("latin-1").translate(to_chars)] += 1
    merges = train_merges(word_counts, n_merges)
    tokens = list(_BYTE_TO_CHAR)
    seen = set(tokens)
    for m in merges:
        t = m.replace(" ", "")
        if t not in seen:
            seen.add(t)
            tokens.append(t)
    extra = [w for w, _ in word_counts.most_common() if len(w) > 3 and w not in seen][:EXTRA_WORDS]
    tokens += extra
    seen.update(extra)
    types = [1] * len(tokens)
    for t, ty in (("<|endoftext|>", 3), ("<|im_start|>", 3), (USER_DEFINED, 4)):
        if t in seen:
            raise ValueError(f"{t!r} is already a token")
        tokens.append(t)
        types.append(ty)
    return tokens, types, merges


def _arch(name):
    # what llama.cpp reads for architecture "llama" even when it loads the vocabulary only
    return [("general.architecture", "STRING", "llama"), ("general.name", "STRING", name),
            ("llama.context_length", "UINT32", 2048), ("llama.embedding_length", "UINT32", 64),
            ("llama.block_count", "UINT32", 1), ("llama.feed_forward_length", "UINT32", 128),
            ("llama.attention.head_count", "UINT32", 4), ("llama.attention.head_count_kv", "UINT32", 4),
            ("llama.attention.layer_norm_rms_epsilon", "FLOAT32", 1e-5), ("llama.rope.dimension_count", "UINT32", 16)]


def write_bpe_vocab(path, pre, vocab, add_bos=None, write_pre=True):
    """Write ``vocab`` = bpe_vocab(...) as a GGUF with tokenizer.ggml.pre = ``pre`` (aliases of one
    pre-tokenizer share a trained vocabulary); ``write_pre=False`` leaves the key out."""
    tokens, types, merges = vocab
    eot = tokens.index("<|endoftext|>")
    meta = _arch(f"orkpy synthetic {pre}") + [("tokenizer.ggml.model", "STRING", "gpt2")]
    if write_pre:
        meta.append(("tokenizer.ggml.pre", "STRING", pre))
    meta += [("tokenizer.ggml.tokens", "ARRAY", tokens),
             ("tokenizer.ggml.token_type", "ARRAY", np.array(types, np.int32)),
             ("tokenizer.ggml.merges", "ARRAY", merges),
             ("tokenizer.ggml.bos_token_id", "UINT32", eot), ("tokenizer.ggml.eos_token_id", "UINT32", eot)]
    if add_bos is not None:
        meta.append(("tokenizer.ggml.add_bos_token", "BOOL", bool(add_bos)))
    orkpy.write_gguf(path, meta, [])
    return path


SPACE = "\u2581"
SPM_WHITESPACE = [SPACE * 2, SPACE * 3, SPACE * 4, SPACE * 8, "\n\n", SPACE + "\n", "\n" + SPACE, "\t\t"]


def spm_vocab(texts, n_merges, add_space_prefix=True):
    """(tokens, scores, token types) of a SentencePiece-style vocabulary (see the module docstring)."""
    units, pairs = collections.Counter(), collections.Counter()
    for text in list(texts) + TRICKY * 20:
        for frag in text.split(USER_DEFINED):
            esc = ((" " if add_space_prefix else "") + frag).replace(" ", SPACE)
            words = [w for w in esc.replace(SPACE, "\0" + SPACE).split("\0") if w]
            units.update(words)
            pairs.update(a + b for a, b in zip(words, words[1:]))
    units.update({u: n for u, n in pairs.items() if n >= 4})   # frequent word pairs: merges cross word starts
    chars = sorted({c for u in units for c in u})
    merges = train_merges(units, n_merges)
    tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(tokens)
    seen = set(tokens)
    pieces = [m.replace(" ", "") for m in merges] + [w for w in SPM_WHITESPACE]
    for rank, t in enumerate(pieces):
        if t not in seen:
            seen.add(t)
            tokens.append(t)
            types.append(1)
            scores.append(-float(rank // 3))   # ties among neighbours in rank: the leftmost rule matters
    for c in chars:
        if c not in seen:
            seen.add(c)
            tokens.append(c)
            types.append(1)
            scores.append(-1e4)
    for t, ty in ((USER_DEFINED, 4), ("<|user|>", 4), ("<|end|>", 4), ("<|endoftext|>", 3), ("<|system|>", 3)):
        if t in seen:
            raise ValueError(f"{t!r} is already a token")
        tokens.append(t)
        types.append(ty)
        scores.append(0.0)
    return tokens, scores, types


def write_spm_vocab(path, vocab, add_space_prefix=True, name="orkpy synthetic spm"):
    """Write ``vocab`` = spm_vocab(...) (train once, write it under several names / flags)."""
    tokens, scores, types = vocab
    meta = _arch(name) + [
        ("tokenizer.ggml.model", "STRING", "llama"), ("tokenizer.ggml.pre", "STRING", "default"),
        ("tokenizer.ggml.tokens", "ARRAY", tokens),
        ("tokenizer.ggml.scores", "ARRAY", np.array(scores, np.float32)),
        ("tokenizer.ggml.token_type", "ARRAY", np.array(types, np.int32)),
        ("tokenizer.ggml.bos_token_id", "UINT32", 1), ("tokenizer.ggml.eos_token_id", "UINT32", 2),
        ("tokenizer.ggml.unknown_token_id", "UINT32", 0),
        ("tokenizer.ggml.add_space_prefix", "BOOL", bool(add_space_prefix))]
    orkpy.write_gguf(path, meta, [])
    return path
