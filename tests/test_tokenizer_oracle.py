"""orkpy.Tokenizer against the live llama.cpp (tests/oracle.py: ork-oracle tokenize, i.e.
llama_tokenize(add_special=true, parse_special=false), as llama-perplexity tokenizes text).

Full texts (slow): the whole of wikitext-2-raw-test and tinystories-val-B, ids identical, for
SmolLM2 (BPE, pre smollm), Gemma-3 (SPM, 262k tokens, no space prefix, user-defined
newline/space/tab runs), stories260K (SPM with space prefix), the Qwen3 skeleton (qwen2), a
synthetic byte-level BPE vocabulary per pre-tokenizer (tests/vocabgen.py trains ~3000 merges
on the texts split by that pre-tokenizer) and synthetic SentencePiece vocabularies whose tokens
cross word starts and hold whitespace runs (with and without space prefix, and named phi-3:
llama.cpp's RSTRIP after user-defined tokens).

Tricky strings (fast): contractions, digit runs, CJK, accents, combining marks, newlines and
CRLF, runs of spaces and tabs, emoji with ZWJ, Unicode 15/16 letters and digits, C0
separators, control and user-defined token texts -- for every supported pre-tokenizer name on a
small synthetic vocabulary (seconds in all), and for the real models (slow: they load
262k-token vocabularies)."""
import pathlib
import re
import unicodedata

import numpy as np
import pytest

from oracle import LLAMA_ROOT, LLAMA_VERSION, oracle_tokens, real_model, required
from orkpy import Tokenizer
from orkpy.runtime.tokenizer import _PRE, PRE_TOKENIZERS, _UnicodeClasses
from vocabgen import EXTRA_WORDS, TRICKY, bpe_vocab, spm_vocab, write_bpe_vocab, write_spm_vocab

TEXTS = {"wikitext": "text/wikitext-2-raw-test.txt", "tinystories": "text/tinystories-val-B.txt"}
# the pre-tokenizers of the model families (issue 15), each on its own trained vocabulary
PRES = ["default", "llama-bpe", "smollm", "qwen2", "deepseek-r1-qwen", "deepseek-llm", "gpt-2", "tekken", "gpt-4o"]
SPMS = {"spm-prefix": (True, "orkpy synthetic spm"), "spm-noprefix": (False, "orkpy synthetic spm"),
        "spm-phi3": (True, "Phi-3 synthetic")}
SHARED_MODELS = {"stories260K": "models/stories260K/stories260K-F32.gguf",
                 "qwen3-skeleton": "models/qwen3-skeleton/qwen3-skel-tied-F16.gguf"}
REAL = ["smollm2", "gemma3"]

TRICKY_TEXTS = {
    "lines": "\n".join(TRICKY) + "\n",
    "specials": "<|endoftext|> <|im_start|>user\n<|im_end|> <s></s><unk> @-@ x@-@y @-@@-@ <|user|>  hi\n"
                "<|user|>\tthere<|end|> end <div>x</div> [multimodal] <start_of_image>\n\n\n\t\t<bos><eos>"
                "<unused0><end_of_turn>    ",
    "edges": "   leading, trailing and   ''s '",
    "digits": "12345678901234567890 1 22 333 4444 55555\r\n\r\n  \n",
    "space": " ",
}


def _first_diff(ours, ref, tok, what):
    """An assertion message naming the first differing position, with the tokens around it."""
    n = min(len(ours), len(ref))
    d = int(np.argmax(ours[:n] != ref[:n])) if (ours[:n] != ref[:n]).any() else n
    lo = max(0, d - 4)
    show = lambda ids: [(int(i), tok.tokens[i]) for i in ids[lo:d + 6]]
    return (f"{what}: orkpy {len(ours)} ids, llama.cpp {len(ref)}; first difference at {d}:\n"
            f"  orkpy     {show(ours)}\n  llama.cpp {show(ref)}")


def assert_same(model_path, text_path, tok=None):
    tok = tok or Tokenizer.from_gguf(model_path)
    text = pathlib.Path(text_path).read_bytes().decode("utf-8")   # as written: keep "\r\n"
    ours = tok.encode(text)
    ref = oracle_tokens(model_path, text_path)
    assert len(ours) == len(ref) and np.array_equal(ours, ref), _first_diff(ours, ref, tok, text_path)
    return len(ours)


# ----------------------------------------------------------------- vocabularies --

@pytest.fixture(scope="session")
def corpus(shared):
    return {k: (shared / p).read_bytes().decode("utf-8") for k, p in TEXTS.items()}


def _memo(factory):
    files = {}

    def get(key):
        if key not in files:
            files[key] = factory(key)
        return files[key]
    return get


@pytest.fixture(scope="session")
def bpe_file(tmp_path_factory, corpus):
    """pre -> a synthetic GGUF trained with 3000 merges on 300k characters of each text."""
    d = tmp_path_factory.mktemp("bpe")
    train = [corpus["wikitext"][:300_000], corpus["tinystories"][:300_000]]
    return _memo(lambda pre: write_bpe_vocab(d / f"{pre}.gguf", pre, bpe_vocab(pre, train, 3000)))


@pytest.fixture(scope="session")
def small_bpe_file(tmp_path_factory, corpus):
    """pre -> a small synthetic GGUF for the fast tests: 1000 merges, mostly of the tricky lines
    (so that they cover whole tricky words: a word split in the wrong place changes the ids);
    trained once per set of expressions, written under each name."""
    d = tmp_path_factory.mktemp("bpe_small")
    train = [corpus["wikitext"][:20_000], corpus["tinystories"][:20_000]]
    vocab = _memo(lambda exprs: bpe_vocab(next(p for p in PRE_TOKENIZERS if _PRE[p].exprs == exprs), train, 1000,
                                          tricky=100))
    return _memo(lambda pre: write_bpe_vocab(d / f"{pre}.gguf", pre, vocab(_PRE[pre].exprs)))


@pytest.fixture(scope="session")
def spm_file(tmp_path_factory, corpus):
    d = tmp_path_factory.mktemp("spm")
    train = [corpus["wikitext"][:300_000], corpus["tinystories"][:300_000]]
    vocab = _memo(lambda prefix: spm_vocab(train, 3000, prefix))
    return _memo(lambda key: write_spm_vocab(d / f"{key}.gguf", vocab(SPMS[key][0]), *SPMS[key]))


@pytest.fixture(scope="session")
def tricky_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("tricky")
    out = {}
    for k, t in TRICKY_TEXTS.items():
        (d / f"{k}.txt").write_bytes(t.encode("utf-8"))
        out[k] = d / f"{k}.txt"
    return out


def _model(key, shared, bpe_file, spm_file):
    if key in REAL:
        return real_model(key)
    if key in SHARED_MODELS:
        return shared / SHARED_MODELS[key]
    if key in SPMS:
        return spm_file(key)
    return bpe_file(key)


# ---------------------------------------------------------------- whole texts --

@pytest.mark.slow
@pytest.mark.parametrize("text", list(TEXTS))
@pytest.mark.parametrize("model", REAL + list(SHARED_MODELS) + PRES + list(SPMS))
def test_whole_text_identical(shared, bpe_file, spm_file, model, text):
    path = _model(model, shared, bpe_file, spm_file)
    assert assert_same(path, shared / TEXTS[text]) > 50_000


@pytest.mark.slow
def test_synthetic_vocabularies_exercise_the_tokenizer(shared, bpe_file, spm_file, corpus):
    # ignore_merges: whole-word tokens BPE cannot build are emitted only by llama3 / tekken
    for pre, emitted in (("llama-bpe", True), ("tekken", True), ("smollm", False), ("gpt-4o", False)):
        tok = Tokenizer.from_gguf(bpe_file(pre))
        extra = set(range(tok.n_vocab - 3 - EXTRA_WORDS, tok.n_vocab - 3))
        hits = sum(i in extra for i in tok.encode(corpus["wikitext"][:200_000]).tolist())
        assert (hits > 0) == emitted, (pre, hits)
    # SPM: tokens cross word starts and hold whitespace runs, so the speed-up cuts fewer places
    tok = Tokenizer.from_gguf(spm_file("spm-prefix"))
    assert {"\n", "\u2581", "e"} <= tok._glue and "\u2581\u2581" in tok._vocab
    assert any(t.count("\u2581") >= 2 and t.strip("\u2581") for t in tok.tokens)


# ------------------------------------------------------------- tricky strings --

# every supported name is tested: the family's listed values on their own vocabularies, the
# aliases (same expressions, own flags: ignore_merges, add_bos, clean_spaces) on theirs
@pytest.mark.parametrize("pre", PRE_TOKENIZERS)
def test_tricky_strings_every_pre_tokenizer(small_bpe_file, tricky_files, pre):
    path = small_bpe_file(pre)
    tok = Tokenizer.from_gguf(path)
    assert tok.pre == pre
    for f in tricky_files.values():
        assert_same(path, f, tok)


@pytest.mark.parametrize("key", list(SPMS))
def test_tricky_strings_spm(tmp_path_factory, tricky_files, key):
    d = tmp_path_factory.mktemp("spm_small")
    path = write_spm_vocab(d / f"{key}.gguf", spm_vocab(["\n".join(TRICKY)], 300, SPMS[key][0]), *SPMS[key])
    tok = Tokenizer.from_gguf(path)
    for f in tricky_files.values():
        assert_same(path, f, tok)


@pytest.mark.slow
@pytest.mark.parametrize("model", REAL + list(SHARED_MODELS))
def test_tricky_strings_real_models(shared, tricky_files, model):
    path = _model(model, shared, None, None)
    tok = Tokenizer.from_gguf(path)
    for f in tricky_files.values():
        assert_same(path, f, tok)


# 100K characters of one whitespace (Gemma-3's run tokens of 2..31 taken longest first, the rest
# left to the next shorter run); the mixed text stays at 20K: llama.cpp's own partition is quadratic
# on it (21 s for 100K characters on Gemma-3)
LONG_WHITESPACE = {"spaces": " " * 100_000, "newlines": "\n" * 100_000, "tabs": "\t" * 100_000,
                   "mixed": (" \n\t  \n\n   \r\n" * 20_000)[:20_000]}


@pytest.mark.slow
@pytest.mark.parametrize("model", REAL)
def test_long_whitespace_real_models(tmp_path, model):
    path = real_model(model)
    tok = Tokenizer.from_gguf(path)
    for k, t in LONG_WHITESPACE.items():
        f = tmp_path / f"{k}.txt"
        f.write_bytes(t.encode("utf-8"))
        assert_same(path, f, tok)


def test_missing_pre_is_default_with_a_warning(tmp_path, corpus, tricky_files):
    # llama.cpp uses the 'default' pre-tokenizer (and warns) when tokenizer.ggml.pre is missing
    vocab = bpe_vocab("default", [corpus["wikitext"][:20_000]], 300)
    path = write_bpe_vocab(tmp_path / "nopre.gguf", "default", vocab, write_pre=False)
    with pytest.warns(UserWarning, match="tokenizer.ggml.pre is missing"):
        tok = Tokenizer.from_gguf(path)
    assert tok.pre == "default"
    assert_same(path, tricky_files["lines"], tok)


def test_unknown_pre_lists_the_supported_ones():
    with pytest.raises(ValueError, match=r"unsupported BPE pre-tokenizer 'deepseek-coder' \(supported: .*llama-bpe.*"
                                         r"smollm.*tekken"):
        Tokenizer(model="gpt2", tokens=["a"], merges=[], pre="deepseek-coder")


# ---------------------------------------------------------- Unicode classes --

def _llama_unicode_data():
    p = LLAMA_ROOT / "src" / f"llama_cpp_python-{LLAMA_VERSION}" / "vendor" / \
        "llama.cpp" / "src" / "unicode-data.cpp"
    if not p.is_file():
        msg = f"llama.cpp's source not found at {p} (run .ci/install)"
        pytest.fail(msg) if required() else pytest.skip(msg)
    return p.read_text(encoding="utf-8")


def _classes():
    _UnicodeClasses.load()
    out = bytearray(0x110000)
    starts = _UnicodeClasses.starts + [0x110000]
    for k, c in enumerate(_UnicodeClasses.classes):
        out[starts[k]:starts[k + 1]] = bytes([c]) * (starts[k + 1] - starts[k])
    return out


def test_unicode_classes_are_llama_cpps():
    """orkpy/runtime/tokenizer/_unicode_classes.py == llama.cpp's src/unicode-data.cpp (categories, whitespace)."""
    src = _llama_unicode_data()
    body = re.search(r"unicode_ranges_flags = \{.*?\n(.*?)\n\};", src, re.S).group(1)
    rows = [(int(a, 16), int(b, 16)) for a, b in re.findall(r"\{0x([0-9A-F]+), 0x([0-9A-F]+)\}", body)]
    ws = re.search(r"unicode_set_whitespace = \{\n(.*?)\n\};", src, re.S).group(1)
    ws = {int(x, 16) for x in re.findall(r"0x([0-9A-F]+)", ws)}
    flag_class = {0x02: 1, 0x04: 2, 0x20: 3, 0x10: 4, 0x40: 5}   # N L P M S; the rest: other
    want = bytearray(0x110000)
    for (a, f), (b, _) in zip(rows, rows[1:]):
        want[a:b] = bytes([flag_class.get(f, 0)]) * (b - a)
    for cp in ws:
        want[cp] = 6
    got = _classes()
    bad = [hex(cp) for cp in range(0x110000) if got[cp] != want[cp]]
    assert not bad, f"{len(bad)} code points differ, first {bad[:10]}"


def test_unicode_classes_agree_with_this_python_where_it_knows_the_character():
    got = _classes()
    major = {"N": 1, "L": 2, "P": 3, "M": 4, "S": 5}
    older = tuple(map(int, unicodedata.unidata_version.split("."))) <= (15, 1, 0)
    checked = 0
    for cp in range(0x110000):
        c = chr(cp)
        cat = unicodedata.category(c)
        if cat == "Cn" or not older:   # unassigned here, or this Python's Unicode is newer than 15.1
            continue
        want = 6 if c.isspace() and not 0x1C <= cp <= 0x1F else major.get(cat[0], 0)
        assert got[cp] == want, (hex(cp), cat, got[cp])
        checked += 1
    if older:
        assert checked > 140_000
    # spot checks that hold in every version: assigned in 15.0/15.1, unassigned in llama.cpp's 15.1
    assert [got[cp] for cp in (0x11F04, 0x11F50, 0x2EBF0, 0x1C89, 0x16D70, 0x3000, 0x1C, 0x85)] == \
        [2, 1, 2, 0, 0, 6, 0, 6]


# ------------------------------------------------------------------- decode --

def test_decode_clean_spaces_as_llama_cpp():
    # llama.cpp's detokenizer clean-up for the BPE types with clean_spaces (gpt2, llama3, ...), not smollm
    chars = [chr(c) for c in range(0x21, 0x7F)]
    ids = lambda tok, s: [tok._vocab[c] for c in s.replace(" ", "\u0120")]
    vocab = chars + ["\u0120"]
    clean = Tokenizer(model="gpt2", tokens=vocab, merges=[], pre="gpt-2")
    raw = Tokenizer(model="gpt2", tokens=vocab, merges=[], pre="smollm")
    for s, want in [("a , b . c ! d ? e", "a, b. c! d? e"), ("x ' y", "x'y"), ("I 'm he 's we 're you 've",
                    "I'm he's we're you've"), ("don 't we 'd they 'll", "don 't we 'd they 'll"),
                    (" ' ' x", "'' x"), ("a  .", "a ."), ("' s", "' s")]:
        assert clean.decode(ids(clean, s)) == want, s
        assert raw.decode(ids(raw, s)) == s
