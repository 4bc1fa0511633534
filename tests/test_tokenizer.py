"""orkpy.Tokenizer: llama.cpp's exact token ids from a GGUF vocabulary.

The real-file counts are llama.cpp's `llama-tokenize` figures recorded in
../shared/README.md. The small cases hold the tokenizer to naive reference
implementations written here from the algorithm's definition (whole text as one
symbol sequence, quadratic best-pair search), independent of the module's
heap/cache/splitting machinery."""

import numpy as np
import pytest

import orkpy
from orkpy import Tokenizer
from ggufgen import ARRAY, BOOL, FLOAT32, INT32, STRING, UINT32, build, kv

regex = pytest.importorskip("regex")

STORIES = "models/stories260K/stories260K-F32.gguf"
QWEN = "models/qwen3-skeleton/qwen3-skel-tied-F16.gguf"
TINY = "text/tinystories-val-B.txt"
WIKI = "text/wikitext-2-raw-test.txt"

# (model file, text file) -> (llama-tokenize count, first ids)
EXPECTED = {
    (STORIES, TINY): (199_091, [1, 410, 454, 425, 356, 261, 419]),
    (STORIES, WIKI): (809_290, None),
    (QWEN, TINY): (102_988, [2043, 415, 327, 274, 725, 268, 547]),
    (QWEN, WIKI): (565_131, None),
}

SAMPLES = [
    "Hello world",
    "  leading spaces and trailing   ",
    "Tabs\tand\nnewlines\n\n\r\nand CRLF\r\n",
    "caf\u00e9 na\u00efve \u00fcber \u0141\u00f3d\u017a",
    "\u4f60\u597d\uff0c\u4e16\u754c \u3053\u3093\u306b\u3061\u306f",
    "emoji \U0001F600\U0001F44D\U0001F3FD and \u2764\ufe0f",
    "numbers 1234567 3.14159 and 10,000",
    "I'm sure it's what we'd've DON'T they'LL",
    "punctuation!!! ??? ... --- (a) [b] {c} <d>",
    "\u00a0non\u2003breaking\u3000spaces\u2028sep",
    "<|endoftext|> <s> </s> <unk> <0x41>",
    "x",
    " ",
    "\n",
]


@pytest.fixture(scope="module")
def stories(shared):
    return Tokenizer.from_gguf(shared / STORIES)


@pytest.fixture(scope="module")
def qwen(shared):
    return Tokenizer.from_gguf(shared / QWEN)


@pytest.fixture(scope="module")
def qwen_merges(shared):
    with orkpy.GGUFFile(shared / QWEN) as g:
        return list(g.metadata["tokenizer.ggml.merges"])


def _read(shared, rel):
    return (shared / rel).read_text(encoding="utf-8")


# -------------------------------------------------------- naive references --

def ref_spm(tok, text, add_bos=True):
    """llama.cpp SPM by definition: escape, one sequence of code points, repeatedly merge the
    adjacent pair that is a token of the highest score (leftmost on ties), byte fallback."""
    vocab = {t: i for i, t in enumerate(tok.tokens)}
    scores = [float(s) for s in tok._scores]
    syms = list((" " + text if tok.add_space_prefix else text).replace(" ", "\u2581")) if text else []
    while True:
        best, best_score = None, None
        for i in range(len(syms) - 1):
            j = vocab.get(syms[i] + syms[i + 1])
            if j is not None and (best is None or scores[j] > best_score):
                best, best_score = i, scores[j]
        if best is None:
            break
        syms[best:best + 2] = [syms[best] + syms[best + 1]]
    ids = [tok.bos_id] if add_bos else []
    for s in syms:
        if s in vocab:
            ids.append(vocab[s])
        else:
            ids.extend(vocab["<0x%02X>" % b] for b in s.encode("utf-8"))
    return ids


def _gpt2_byte_chars():
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    extra = [b for b in range(256) if b not in keep]
    table = {b: chr(b) for b in keep}
    table.update({b: chr(256 + k) for k, b in enumerate(extra)})
    return table


QWEN2_RE = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
            r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def ref_bpe(tok, merges, text):
    """Byte-level BPE by definition: Qwen2 regex words, GPT-2 byte chars, repeatedly merge the
    adjacent pair of lowest merge rank (leftmost on ties)."""
    ranks = {}
    for r, m in enumerate(merges):
        a, b = m.split(" ", 1)
        ranks.setdefault((a, b), r)
    vocab = {t: i for i, t in enumerate(tok.tokens)}
    table = _gpt2_byte_chars()
    ids = []
    for word in regex.findall(QWEN2_RE, text):
        syms = [table[b] for b in word.encode("utf-8")]
        while True:
            best = min(((ranks[(syms[i], syms[i + 1])], i) for i in range(len(syms) - 1)
                        if (syms[i], syms[i + 1]) in ranks), default=None)
            if best is None:
                break
            i = best[1]
            syms[i:i + 2] = [syms[i] + syms[i + 1]]
        ids.extend(vocab[s] for s in syms)
    return ids


# ------------------------------------------------------------ real files ---

@pytest.mark.parametrize("model,text", list(EXPECTED))
def test_llama_cpp_token_counts(shared, model, text):
    tok = Tokenizer.from_gguf(shared / model)
    ids = tok.encode(_read(shared, text))
    count, first = EXPECTED[(model, text)]
    assert ids.dtype == np.int32 and ids.ndim == 1
    assert len(ids) == count
    if first is not None:
        assert ids[:7].tolist() == first
    assert ids.min() >= 0 and ids.max() < tok.n_vocab


def test_stories_vocab_facts(stories):
    assert stories.model == "llama" and stories.n_vocab == 512 == len(stories)
    assert (stories.bos_id, stories.eos_id, stories.unk_id) == (1, 2, 0)
    assert stories.add_bos and not stories.add_eos and stories.add_space_prefix
    # the splitting assumption documented in orkpy/runtime/tokenizer/__init__.py: no token has "\u2581" after index 0
    assert not any("\u2581" in t[1:] for t in stories.tokens)
    assert stories._glue == frozenset()


def test_qwen_vocab_facts(qwen):
    assert qwen.model == "gpt2" and qwen.pre == "qwen2" and qwen.n_vocab == 2048
    assert (qwen.bos_id, qwen.eos_id) == (2045, 2047)
    assert not qwen.add_bos and not qwen.add_eos
    assert qwen.encode("Once upon a time")[0] != qwen.bos_id


def test_from_gguf_accepts_open_file(shared):
    with orkpy.GGUFFile(shared / QWEN) as g:
        tok = Tokenizer.from_gguf(g)
    assert tok.encode("Hello there").tolist() == Tokenizer.from_gguf(str(shared / QWEN)).encode(
        "Hello there").tolist()


@pytest.mark.parametrize("text", SAMPLES)
def test_stories_matches_reference(stories, text):
    assert stories.encode(text).tolist() == ref_spm(stories, text)
    assert stories.encode(text, add_special=False).tolist() == ref_spm(stories, text, add_bos=False)


@pytest.mark.parametrize("text", SAMPLES)
def test_qwen_matches_reference(qwen, qwen_merges, text):
    assert qwen.encode(text).tolist() == ref_bpe(qwen, qwen_merges, text)


@pytest.mark.parametrize("text", [TINY, WIKI])
def test_real_text_chunks_match_reference(shared, stories, qwen, qwen_merges, text):
    # the SPM reference runs the whole chunk as one symbol sequence (no word splitting)
    body = _read(shared, text)
    merges = qwen_merges
    for start in (0, 5000, len(body) // 2):
        chunk = body[start:start + 700]
        assert stories.encode(chunk).tolist() == ref_spm(stories, chunk)
        assert qwen.encode(chunk).tolist() == ref_bpe(qwen, merges, chunk)


def test_qwen2_pretokenizer_splits(qwen):
    words = qwen._pretokenize("Hello world's 123\n\n  x  ")
    assert words == ["Hello", " world", "'s", " ", "1", "2", "3", "\n\n", " ", " x", "  "]
    words = qwen._pretokenize("WE'RE ok?!\r\n\tdone")
    assert words == ["WE", "'RE", " ok", "?!\r\n", "\tdone"]   # a tab may lead a word


# ---------------------------------------------------------- decode / edges ---

@pytest.mark.parametrize("text", SAMPLES)
def test_round_trip(stories, qwen, text):
    assert qwen.decode(qwen.encode(text)) == text
    # llama.cpp drops the SPM prefix space only when the first token is not BOS
    assert stories.decode(stories.encode(text, add_special=False)) == text
    assert stories.decode(stories.encode(text)) == " " + text


def test_spm_byte_fallback(stories):
    ids = stories.encode("\U0001F600").tolist()
    byte = [stories.tokens.index("<0x%02X>" % b) for b in "\U0001F600".encode("utf-8")]
    assert ids == [1, stories.tokens.index("\u2581")] + byte
    assert stories.decode(ids) == " \U0001F600"
    # a character missing from the vocabulary inside a word
    ids = stories.encode("a\u0416b", add_special=False).tolist()
    assert [stories.tokens[i] for i in ids] == ["\u2581a", "<0xD0>", "<0x96>", "b"]


def test_empty_string(stories, qwen):
    assert stories.encode("").tolist() == [1]
    assert stories.encode("", add_special=False).tolist() == []
    assert qwen.encode("").tolist() == []
    assert qwen.encode("").dtype == np.int32
    assert stories.decode([]) == "" and qwen.decode(np.array([], np.int32)) == ""


def test_decode_specials(stories, qwen):
    assert stories.decode([1, 2]) == ""
    assert stories.decode([1], special=True) == "<s>"
    assert qwen.decode([2045, 2046, 2047]) == ""
    assert qwen.decode([2046], special=True) == "<|im_start|>"
    # control tokens written in text are plain text with parse_special=false
    assert 2045 not in qwen.encode("<|endoftext|>").tolist()
    assert qwen.token_to_piece(qwen.encode(" the")[0]) == b" the"


def test_bad_inputs(stories):
    for bad in (b"bytes", None, 3, ["a"]):
        with pytest.raises(TypeError):
            stories.encode(bad)
    with pytest.raises(TypeError):
        stories.encode("x", add_special="yes")
    with pytest.raises(ValueError, match="surrogate"):
        stories.encode("a\ud800b")
    with pytest.raises(TypeError):
        stories.decode("hello")
    with pytest.raises(TypeError):
        stories.decode([1.5])
    with pytest.raises(TypeError):
        stories.decode(np.array([1.0, 2.0]))
    with pytest.raises(TypeError):
        stories.decode(5)
    with pytest.raises(ValueError, match="512"):
        stories.decode([1, 512])
    with pytest.raises(ValueError, match="-1"):
        stories.decode([-1])
    with pytest.raises(TypeError):
        Tokenizer.from_gguf(12)


def _write(tmp_path, kvs, name="t.gguf"):
    data, _ = build(kvs, [("a", (32,), 0, bytes(128))])
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_gguf_without_tokenizer_is_value_error(tmp_path):
    p = _write(tmp_path, [kv("general.architecture", STRING, "llama")])
    with pytest.raises(ValueError, match="no tokenizer metadata"):
        Tokenizer.from_gguf(p)


def test_unsupported_or_broken_metadata(tmp_path):
    toks = kv("tokenizer.ggml.tokens", ARRAY, ["a", "b"], STRING)
    cases = {
        "bert": [kv("tokenizer.ggml.model", STRING, "bert"), toks],
        "not a string array": [kv("tokenizer.ggml.model", STRING, "llama")],
        "merges": [kv("tokenizer.ggml.model", STRING, "gpt2"), toks],
        "pre-tokenizer": [kv("tokenizer.ggml.model", STRING, "gpt2"), toks,
                          kv("tokenizer.ggml.merges", ARRAY, ["a b"], STRING),
                          kv("tokenizer.ggml.pre", STRING, "no-such-pre")],
        "duplicate": [kv("tokenizer.ggml.model", STRING, "llama"),
                      kv("tokenizer.ggml.tokens", ARRAY, ["a", "<s>", "a"], STRING)],
        "BOS": [kv("tokenizer.ggml.model", STRING, "gpt2"), toks,
                kv("tokenizer.ggml.merges", ARRAY, ["a b"], STRING), kv("tokenizer.ggml.pre", STRING, "qwen2"),
                kv("tokenizer.ggml.add_bos_token", BOOL, 1)],
    }
    for k, (match, kvs) in enumerate(cases.items()):
        with pytest.raises(ValueError, match=match):
            Tokenizer.from_gguf(_write(tmp_path, kvs, f"c{k}.gguf"))


# ------------------------------------------------ synthetic vocabularies ---

def _spm_vocab(extra, user=()):
    tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(tokens)
    for k, t in enumerate(extra):
        tokens.append(t)
        types.append(1)
        scores.append(-float(k % 5))     # many ties, to exercise the leftmost rule
    for t in user:
        tokens.append(t)
        types.append(4)
        scores.append(0.0)
    return tokens, scores, types


def test_spm_glue_tokens_match_whole_text_reference():
    # tokens with "\u2581" inside: merges may cross word starts, so the fast path must not cut there
    extra = ["\u2581", "a", "b", "c", "a\u2581", "\u2581\u2581", "\u2581b", "ab", "a\u2581b", "\u2581a",
             "b\u2581\u2581", "\u2581\u2581\u2581", "ca", "\u2581c"]
    tokens, scores, types = _spm_vocab(extra)
    tok = Tokenizer(model="llama", tokens=tokens, scores=scores, token_types=types)
    assert tok._glue == frozenset({"a", "\u2581", "b"})
    rng = np.random.default_rng(7)
    for _ in range(300):
        text = "".join(rng.choice(list("abc  \u00e9"), size=int(rng.integers(0, 30))))
        assert tok.encode(text).tolist() == ref_spm(tok, text), repr(text)


def test_spm_user_defined_tokens_are_split_out():
    tokens, scores, types = _spm_vocab(["\u2581", "x", "y", "\u2581x", "\u2581y"], user=["<tag>"])
    tok = Tokenizer(model="llama", tokens=tokens, scores=scores, token_types=types)
    tag = tokens.index("<tag>")
    # the text after a user-defined token gets the space prefix again, as in llama.cpp
    assert tok.encode("x<tag>y").tolist() == [1, tokens.index("\u2581x"), tag, tokens.index("\u2581y")]
    assert tok.decode(tok.encode("x<tag>y", add_special=False)) == "x<tag> y"


def ref_partition(text, users, rstrip=False):
    """llama.cpp's tokenizer_st_partition by definition: the tokens in order, each splitting every
    remaining text fragment at its leftmost non-overlapping occurrences (+ RSTRIP)."""
    frags = [text]
    for word, tid in users:
        out = []
        for f in frags:
            if isinstance(f, int):
                out.append(f)
                continue
            while word in f:
                left, f = f.split(word, 1)
                if left:
                    out.append(left)
                out.append(tid)
                if rstrip:
                    f = f.lstrip(" \t\n\v\f\r")
            if f:
                out.append(f)
        frags = out
    return frags


@pytest.mark.parametrize("phi3", [False, True])
def test_partition_matches_reference(phi3):
    # overlapping user-defined tokens of equal and different lengths, taken longest first
    users = ["abab", "bab", "ab", "ba", "b b", " a", "aa"]
    tokens, scores, types = _spm_vocab(["a", "b", "\u2581"], user=users)
    tok = Tokenizer(model="llama", tokens=tokens, scores=scores, token_types=types,
                    model_name="Phi-3 mini" if phi3 else "other")
    order = sorted(users, key=lambda w: (-len(w), tokens.index(w)))
    rng = np.random.default_rng(3)
    for _ in range(500):
        text = "".join(rng.choice(list("aab b\t"), size=int(rng.integers(0, 25))))
        want = ref_partition(text, [(w, tokens.index(w)) for w in order], rstrip=phi3)
        assert tok._partition(text) == want, repr(text)


def test_eog_and_fim_texts_are_control_even_when_user_defined():
    # llama.cpp marks "<|end|>", "<|im_end|>", "<fim_prefix>", ... control by their text: not split
    # out of raw text, dropped by decode; a fill-in-the-middle token named by id keeps its type
    tokens, scores, types = _spm_vocab(["\u2581", "x"], user=["<|end|>", "<fim_prefix>", "<tag>"])
    tok = Tokenizer(model="llama", tokens=tokens, scores=scores, token_types=types)
    ids = tok.encode("x<|end|>x<fim_prefix>x<tag>", add_special=False).tolist()
    assert tokens.index("<tag>") in ids
    assert tokens.index("<|end|>") not in ids and tokens.index("<fim_prefix>") not in ids
    assert tok.decode([tokens.index("<|end|>")]) == "" and tok.decode([tokens.index("<tag>")]) == "<tag>"
    named = Tokenizer(model="llama", tokens=tokens, scores=scores, token_types=types,
                      special_ids={"fim_pre": tokens.index("<fim_prefix>")})
    assert tokens.index("<fim_prefix>") in named.encode("x<fim_prefix>x").tolist()


def test_spm_flags_from_metadata(tmp_path):
    tokens, scores, types = _spm_vocab(["\u2581", "x", "\u2581x"])
    kvs = [kv("tokenizer.ggml.model", STRING, "llama"),
           kv("tokenizer.ggml.tokens", ARRAY, tokens, STRING),
           kv("tokenizer.ggml.scores", ARRAY, scores, FLOAT32),
           kv("tokenizer.ggml.token_type", ARRAY, types, INT32),
           kv("tokenizer.ggml.bos_token_id", UINT32, 2), kv("tokenizer.ggml.eos_token_id", UINT32, 1),
           kv("tokenizer.ggml.unknown_token_id", UINT32, 4294967295),
           kv("tokenizer.ggml.add_eos_token", BOOL, 1), kv("tokenizer.ggml.add_space_prefix", BOOL, 0)]
    tok = Tokenizer.from_gguf(_write(tmp_path, kvs))
    assert (tok.bos_id, tok.eos_id, tok.unk_id) == (2, 1, 0)   # out-of-range unk keeps the default
    assert tok.add_bos and tok.add_eos and not tok.add_space_prefix
    x = tokens.index("x")
    assert tok.encode("x").tolist() == [2, x, 1]
    assert tok.encode("x", add_special=False).tolist() == [x]


def test_bpe_rank_order_and_byte_chars():
    # a merge list whose later merges outrank earlier-created pairs: the heap order matters
    table = _gpt2_byte_chars()
    base = [table[b] for b in range(256)]
    merges = ["a b", "ab a", "b a", "ab ab", "\u0120 a"]
    tokens = base + ["ab", "aba", "ba", "abab", "\u0120a"]
    tok = Tokenizer(model="gpt2", tokens=tokens, merges=merges, pre="qwen2")
    for text in ["abab", "ababa", "ba ab", " a", "\u00e9\U0001F600 ab\nab"]:
        assert tok.encode(text).tolist() == ref_bpe(tok, merges, text), text
        assert tok.decode(tok.encode(text)) == text


# ------------------------------------------------ long whitespace runs ---

class _CountingStr(str):
    """A text that counts the substring searches made on it (``find``): the work the special-token
    partition does, independent of the machine's speed."""
    finds = 0

    def find(self, *args):
        type(self).finds += 1
        return super().find(*args)


def _gemma_like_runs():
    """Gemma-3's user-defined whitespace tokens: runs of 2..31 spaces, newlines and tabs."""
    return [c * k for k in range(31, 1, -1) for c in ("\n", " ", "\t")]


@pytest.mark.parametrize("what", ["spaces", "newlines", "tabs", "mixed"])
def test_partition_work_on_long_whitespace_is_linear(what):
    # 100K spaces took ~30 searches per character (every shorter run token retried at every
    # position inside the spans the longer ones took, 2 s on Gemma-3) and a mixed text inserted
    # each span into the middle of a list (quadratic). Now a search resumes after the span that
    # blocks it: at most one search per (token, span), whatever the text's length.
    runs = _gemma_like_runs()
    tokens, scores, types = _spm_vocab(["\u2581", "\n", "\t", "\r"], user=runs)
    tok = Tokenizer(model="llama", tokens=tokens, scores=scores, token_types=types, add_space_prefix=False)
    n = 100_000
    text = {"spaces": " " * n, "newlines": "\n" * n, "tabs": "\t" * n,
            "mixed": (" \n\t  \n\n   \r\n" * n)[:n]}[what]
    _CountingStr.finds = 0
    parts = tok._partition(_CountingStr(text))
    present = sum(w in text for w in runs)
    spans = sum(isinstance(p, int) for p in parts)
    assert _CountingStr.finds <= (present + 1) * (spans + 1), (_CountingStr.finds, present, spans)
    if what != "mixed":   # the old code: about 29 * n searches
        assert _CountingStr.finds < n
    # the ids are those of the definition: the longest run first, then the remainder's run
    ids = tok.encode(text, add_special=False).tolist()
    if what == "mixed":
        assert "".join(tokens[i] for i in ids).replace("\u2581", " ") == text
        assert tok.decode(ids) == text
    else:
        c = text[0]
        want = [tokens.index(c * 31)] * (n // 31) + [tokens.index(c * (n % 31))]
        assert ids == want


def test_partition_long_whitespace_matches_reference():
    # the jump over a blocking span is exact: short random texts of runs against llama.cpp's
    # definition (ref_partition), with the run tokens of different lengths overlapping everywhere
    runs = [c * k for k in (7, 5, 3, 2) for c in (" ", "\n")] + [" \n", "\n \n"]
    tokens, scores, types = _spm_vocab(["\u2581", "\n"], user=runs)
    tok = Tokenizer(model="llama", tokens=tokens, scores=scores, token_types=types, add_space_prefix=False)
    order = sorted(runs, key=lambda w: (-len(w), tokens.index(w)))
    rng = np.random.default_rng(11)
    for _ in range(400):
        text = "".join(rng.choice([" ", "\n", "  ", "x"], size=int(rng.integers(0, 60))))
        assert tok._partition(text) == ref_partition(text, [(w, tokens.index(w)) for w in order]), repr(text)


@pytest.mark.parametrize("what", ["spaces", "newlines", "mixed"])
def test_gemma_one_million_whitespace_characters(what):
    # a size that is only feasible when the partition is linear (the old code needed ~25 s for
    # 1M spaces and more for the mixed text, growing with the length); exactness: 2n characters
    # give the ids of n twice where the text's period meets a token boundary
    from oracle import real_model
    tok = Tokenizer.from_gguf(real_model("gemma3"))
    unit = {"spaces": " " * 31, "newlines": "\n" * 31, "mixed": " \n\t  \n\n   \r\n" * 3 + "x"}[what]
    k = 1_000_000 // len(unit)
    half = tok.encode(unit * (k // 2), add_special=False)
    whole = tok.encode(unit * (k // 2 * 2), add_special=False)
    assert np.array_equal(whole, np.concatenate([half, half]))
    one = tok.encode(unit, add_special=False)
    assert np.array_equal(whole, np.tile(one, k // 2 * 2))
    if what != "mixed":
        assert len(one) == 1 and tok.tokens[one[0]] == unit   # the 31-character run token
