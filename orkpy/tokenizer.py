"""Tokenizers built from a GGUF file's own vocabulary, giving llama.cpp's token ids.

``Tokenizer.from_gguf(path_or_gguf_file)`` reads only the ``tokenizer.ggml.*``
metadata (and ``general.name``). ``tok.encode(text)`` behaves like llama.cpp's
``common_tokenize(ctx, text, add_special=True, parse_special=False)`` -- the way
llama-perplexity tokenizes text -- and ``tok.decode(ids)`` like
``common_detokenize(ctx, ids, special=False)``.

Special tokens first (llama.cpp's ``tokenizer_st_partition``)
    User-defined tokens (token type 4) are split out of the text before anything
    else, even without special parsing; control and unknown tokens written in the
    text are plain text. As in llama.cpp, the tokens are taken longest first, each
    splitting every remaining text fragment at its leftmost non-overlapping
    occurrences, and a token whose text llama.cpp recognises as end-of-generation
    or fill-in-the-middle (``<|im_end|>``, ``<end_of_turn>``, ``<|fim_prefix|>``,
    ...) counts as control. For a model whose ``general.name`` contains "phi-3"
    or "phi3" the whitespace right of a split token is dropped (llama.cpp's RSTRIP).
    Cost: one substring search of the text per user-defined token, then work
    linear in the number of occurrences (Gemma-3 has 165 such tokens: newline,
    space and tab runs, HTML tags).

``tokenizer.ggml.model = "llama"`` (SentencePiece-style, llama.cpp's SPM)
    Each text fragment gets a space in front when it follows BOS or a split-out
    token (``tokenizer.ggml.add_space_prefix``, default true; Gemma-3: false),
    every ``" "`` becomes ``"\u2581"``, the fragment is split into code points and
    adjacent symbols are merged greedily: always the pair whose concatenation is a
    vocabulary token of the highest score, the leftmost one on ties. A final
    symbol that is not a token is emitted as its UTF-8 bytes through the
    ``<0xXX>`` byte tokens.

    Speed-up, exact by construction: a merged symbol is always a vocabulary
    token, so no merge can ever cover the boundary between two adjacent
    characters ``a b`` unless some token contains the substring ``ab``. Before
    tokenizing, a fragment is cut in front of every ``"\u2581"`` whose left
    neighbour ``c`` is such that no token contains ``c + "\u2581"``; the pieces
    are tokenized independently (and cached). This yields exactly the same
    merges as running the whole fragment as one sequence, whatever the
    vocabulary: for one containing ``"\u2581\u2581"`` runs of spaces simply stay
    in one piece, and newlines never start a cut. stories260K has no token with
    a ``"\u2581"`` after its first character, Gemma-3 one (``">\u2581</"``), so
    nearly every word is its own piece.

``tokenizer.ggml.model = "gpt2"`` (byte-level BPE, llama.cpp's BPE)
    Each text fragment is split into words by the pre-tokenizer of
    ``tokenizer.ggml.pre``: llama.cpp's regular expressions for that type
    (src/llama-vocab.cpp), applied in order, each splitting the pieces the
    previous ones left (text between matches is a piece too). Each word's UTF-8
    bytes are mapped to printable characters with GPT-2's byte-to-unicode table
    and merged by rank (position in ``tokenizer.ggml.merges``, lowest first,
    leftmost on ties); with ``ignore_merges`` (llama3, tekken) a word that is a
    token is emitted whole. Results are cached per word. Supported
    ``tokenizer.ggml.pre`` values (:data:`PRE_TOKENIZERS`, by regex set):

    - ``default`` (also used, with a warning, when the key is missing)
    - llama3: ``llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0
      lfm2 jina-v5-nano`` (ignore_merges, BOS added) and ``dbrx smaug-bpe``
    - smollm / starcoder: ``smollm starcoder refact command-r codeshell exaone
      minerva-7b mellum2``
    - qwen2: ``qwen2 deepseek-r1-qwen kormo f2llmv2 megrez stablelm2 hunyuan
      solar-open``
    - gpt2: ``gpt-2 phi-2 gigachat a.x-4.0 mellum mpt olmo jais trillion
      granite-docling exaone4``
    - ``deepseek-llm``; ``tekken`` (ignore_merges, BOS added); gpt-4o:
      ``gpt-4o llama4 kanana2 talkie minimax-m2``

    llama.cpp does not run these expressions on the text as written: for one
    that uses a Unicode category it first replaces every non-ASCII code point by
    one byte standing for its class (letter, number, punctuation, mark, symbol,
    whitespace, other) and matches ASCII-only classes (std::regex); otherwise it
    matches the code points with non-ASCII whitespace replaced (std::wregex); the
    gpt2/llama3/qwen2 expressions run through hand-written matchers that give
    the same splits. This module does the same (Python ``re``, ASCII mode) with
    the classes of :mod:`orkpy._unicode_classes` (Unicode 15.1, equal to
    llama.cpp's src/unicode-data.cpp), not those of the installed Python
    (3.11: Unicode 14) or ``regex`` (16 or later: a letter added in Unicode 16 is
    "other" to llama.cpp). llama.cpp's expressions are its adaptations of the
    Hugging Face ones: in tekken and gpt-4o any non-ASCII letter counts as both
    upper and lower case, as here.

Speed (one core, empty caches, the 1.3 MB wikitext-2 test file): SmolLM2 and
Gemma-3 (262,144 tokens) each take about 0.5 s on an idle core (1.1-1.4 s on a
busy one), plus 0.1-0.5 s to build the tokenizer.

Specials: BOS is prepended iff ``add_special`` and the vocabulary's add_bos
(``tokenizer.ggml.add_bos_token``; default true for "llama" and for the
llama3/tekken pre-tokenizers, false otherwise); EOS is appended iff
``add_special`` and ``tokenizer.ggml.add_eos_token`` is true (default false).
``decode`` drops control and unknown tokens unless ``special`` and, for the BPE
types llama.cpp marks ``clean_spaces`` (default, llama3, gpt2, starcoder, ...),
applies its clean-up of spaces before ``?!.,`` and contractions.

Known limits against llama.cpp: the pre-tokenizer types not listed above
(deepseek-coder/v3, falcon, chatglm, bloom, kimi-k2, gemma4, ...) and the
"t5"/"bert"/"rwkv" vocabularies are refused with a ValueError naming what is
supported; llama.cpp orders same-length special tokens with an unstable sort (this
module by id), which matters only for overlapping user-defined tokens of equal
length, and makes only one (in hash order) of several fill-in-the-middle spellings
present in a vocabulary control (this module: all of them); token attributes it sets
by model name other than phi-3 (jina, modern-bert LSTRIP) and gpt-oss's
``<|channel|>``-style overrides are not applied; a pattern match of zero length
(none of the supported expressions can produce one) would be skipped.
"""
from __future__ import annotations

import base64
import bisect
import codecs
import heapq
import os
import re
import warnings
import zlib
from typing import (TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple,
                    Union, cast)

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._typing import StrPath

if TYPE_CHECKING:
    from .gguf import GGUFFile

__all__ = ["Tokenizer", "TextStream", "PRE_TOKENIZERS"]

# GGUF token types (llama.cpp's llama_token_type)
TOKEN_UNDEFINED, TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = range(7)
# llama.cpp's token attributes (llama_token_attr), from the types and the token texts
_A_UNKNOWN, _A_UNUSED, _A_NORMAL, _A_CONTROL, _A_USER, _A_BYTE = 1 << 1, 1 << 2, 1 << 3, 1 << 4, 1 << 5, 1 << 6
_TYPE_ATTR = {TOKEN_UNKNOWN: _A_UNKNOWN, TOKEN_UNUSED: _A_UNUSED, TOKEN_NORMAL: _A_NORMAL,
              TOKEN_CONTROL: _A_CONTROL, TOKEN_USER_DEFINED: _A_USER, TOKEN_BYTE: _A_BYTE}
# texts llama.cpp makes control tokens whatever their type: end-of-generation / end-of-turn ...
_CONTROL_TEXTS = frozenset([
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~["])
# ... and fill-in-the-middle spellings, unless the vocabulary names that token by id
_FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>", "<PRE>",
                "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>", "<SUF>",
                "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>", "<MID>",
                "\u2581<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_FIM_KEYS = {"fim_pre": ("fim_pre_token_id", "prefix_token_id"), "fim_suf": ("fim_suf_token_id", "suffix_token_id"),
             "fim_mid": ("fim_mid_token_id", "middle_token_id"), "fim_pad": ("fim_pad_token_id",),
             "fim_rep": ("fim_rep_token_id",), "fim_sep": ("fim_sep_token_id",)}
# end-of-turn / end-of-message ids a vocabulary may declare (they end generation, as EOS does)
_EOG_KEYS = {"eot": ("eot_token_id",), "eom": ("eom_token_id",)}

_SPACE = "\u2581"

# ----------------------------------------------------------- pre-tokenizers --
# llama.cpp's regex_exprs per pre-tokenizer type (src/llama-vocab.cpp, llm_tokenizer_bpe)
_GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_LLAMA3_RE = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}" + _TAIL
_QWEN2_RE = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}" + _TAIL
_UPPER = r"((?=[\p{L}])([^a-z]))"
_LOWER = r"((?=[\p{L}])([^A-Z]))"
_TEKKEN_TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_DEEPSEEK_LETTERS = (
    "A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373\u0376\u0377"
    "\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f"
    "\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
    "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d"
    "\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb"
    "\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128"
    "\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4"
    "\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf"
    "\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943")
_PRE_EXPRS: Dict[str, Tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2_RE, r"\p{N}+", "[0-9][0-9][0-9]"),
    "llama3": (_LLAMA3_RE,),
    "smollm": (r"\p{N}", _GPT2_RE),
    "qwen2": (_QWEN2_RE,),
    "gpt2": (_GPT2_RE,),
    "deepseek-llm": ("[\r\n]", r"\s?[" + _DEEPSEEK_LETTERS + "]+",
                     r"\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+", r"\s+$",
                     "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+", r"\p{N}+"),
    "tekken": (r"[^\r\n\p{L}\p{N}]?" + _UPPER + "*" + _LOWER + r"+|[^\r\n\p{L}\p{N}]?" + _UPPER + "+" + _LOWER
               + r"*|\p{N}" + _TEKKEN_TAIL,),
    "gpt-4o": (r"[^\r\n\p{L}\p{N}]?" + _UPPER + "*" + _LOWER + "+" + _CONTRACTIONS + r"?|[^\r\n\p{L}\p{N}]?"
               + _UPPER + "+" + _LOWER + "*" + _CONTRACTIONS + r"?|\p{N}{1,3}" + _TEKKEN_TAIL,),
}


class _Pre:
    """What a tokenizer.ggml.pre value means to llama.cpp: its regex set and flags."""
    __slots__ = ("exprs", "ignore_merges", "add_bos", "clean_spaces")

    def __init__(self, exprs: str, ignore_merges: bool = False, add_bos: bool = False,
                 clean_spaces: bool = True) -> None:
        self.exprs, self.ignore_merges, self.add_bos, self.clean_spaces = exprs, ignore_merges, add_bos, clean_spaces


def _pre_table() -> Dict[str, _Pre]:
    # tokenizer.ggml.pre -> llama.cpp's settings (llama_vocab::impl::load)
    t: Dict[str, _Pre] = {}
    for names, pre in (
            ("default", _Pre("default")),
            ("llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano",
             _Pre("llama3", ignore_merges=True, add_bos=True)),
            ("dbrx smaug-bpe", _Pre("llama3")),
            ("smollm command-r", _Pre("smollm", clean_spaces=False)),
            ("starcoder refact codeshell exaone minerva-7b mellum2", _Pre("smollm")),
            ("qwen2 deepseek-r1-qwen kormo f2llmv2 hunyuan solar-open", _Pre("qwen2", clean_spaces=False)),
            ("stablelm2 megrez", _Pre("qwen2")),
            ("gpt-2 phi-2 gigachat a.x-4.0 mellum mpt olmo jais exaone4", _Pre("gpt2")),
            ("trillion granite-docling", _Pre("gpt2", clean_spaces=False)),
            ("deepseek-llm", _Pre("deepseek-llm", clean_spaces=False)),
            ("tekken", _Pre("tekken", ignore_merges=True, add_bos=True, clean_spaces=False)),
            ("gpt-4o llama4 kanana2 talkie minimax-m2", _Pre("gpt-4o", clean_spaces=False))):
        for name in names.split():
            t[name] = pre
    return t


_PRE = _pre_table()
#: the supported ``tokenizer.ggml.pre`` values
PRE_TOKENIZERS: Tuple[str, ...] = tuple(sorted(_PRE))

# llama.cpp's collapsed text: a non-ASCII code point becomes one character standing for its class
_CLASS_CHAR = "\xd0\xd1\xd2\xd3\xd4\xd5\x0b"   # other, \p{N}, \p{L}, \p{P}, \p{M}, \p{S}, whitespace
_CATEGORY = {"N": 1, "L": 2, "P": 3, "M": 4, "S": 5, "Lu": 2, "Ll": 2, "Lt": 2, "Lm": 2, "Lo": 2}
# the ASCII members of each class, as llama.cpp writes them into a collapsed regex
_CATEGORY_ASCII = {1: "0-9", 2: "A-Za-z", 3: r"!-#%-*,-/:-;?-@\[-\]_\{\}", 4: "", 5: r"\$\+<->^`\|\~"}


class _UnicodeClasses:
    """Code point -> class (0 other, 1 N, 2 L, 3 P, 4 M, 5 S, 6 whitespace), decoded on first use."""
    starts: List[int] = []
    classes = b""

    @classmethod
    def load(cls) -> None:
        if cls.starts:
            return
        from ._unicode_classes import RUNS
        runs = zlib.decompress(base64.b85decode(RUNS))
        starts, classes, cp, v, shift = [], bytearray(), 0, 0, 0
        for b in runs:
            v |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                starts.append(cp)
                classes.append(v & 7)
                cp += v >> 3
                v = shift = 0
        if cp != 0x110000:
            raise RuntimeError("orkpy._unicode_classes is corrupt")
        cls.classes = bytes(classes)
        cls.starts = starts

    @classmethod
    def of(cls, cp: int) -> int:
        cls.load()
        return cls.classes[bisect.bisect_right(cls.starts, cp) - 1]


# non-ASCII code point -> its collapsed character (class), and -> itself or "\x0b" (whitespace)
_COLLAPSE: Dict[int, str] = {}
_WIDE: Dict[int, str] = {}


def _translated(text: str, table: Dict[int, str], wide: bool) -> str:
    if text.isascii():
        return text
    missing = [ord(c) for c in set(text) if c >= "\x80" and ord(c) not in table]
    for cp in missing:
        k = _UnicodeClasses.of(cp)
        table[cp] = "\x0b" if k == 6 else chr(cp) if wide else _CLASS_CHAR[k]
    return text.translate(table)


def _compile_expr(expr: str) -> Tuple[bool, re.Pattern[str]]:
    """(collapsed?, compiled) for one of llama.cpp's expressions: with a \\p{..} category it runs on
    the collapsed text with each category replaced by its collapsed character plus its ASCII
    members, as llama.cpp does; ``$`` is the end of the piece (ECMAScript), ``\\Z`` in Python."""
    collapsed = any(f"\\p{{{c}}}" in expr for c in _CATEGORY)
    out: List[str] = []
    inside = False
    i = 0
    while i < len(expr):
        c = expr[i]
        if c == "\\" and i + 1 < len(expr):
            m = re.match(r"\\p\{(\w+)\}", expr[i:]) if collapsed else None
            if m and m.group(1) in _CATEGORY:
                k = _CATEGORY[m.group(1)]
                body = _CLASS_CHAR[k] + _CATEGORY_ASCII[k]
                out.append(body if inside else f"[{body}]")
                i += m.end()
                continue
            out.append(expr[i:i + 2])
            i += 2
            continue
        if c == "[":
            inside = True
        elif c == "]" and inside:
            inside = False
        elif c == "$" and not inside:
            c = r"\Z"
        elif collapsed and c >= "\x80":
            raise ValueError(f"pre-tokenizer expression mixes categories and non-ASCII characters: {expr!r}")
        out.append(c)
        i += 1
    return collapsed, re.compile("".join(out), re.ASCII)


_CACHE_LIMIT = 1 << 18


def _bytes_to_unicode() -> List[str]:
    """GPT-2's reversible byte -> printable character table."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return [table[b] for b in range(256)]


_BYTE_TO_CHAR = _bytes_to_unicode()
_CHAR_TO_BYTE = {c: b for b, c in enumerate(_BYTE_TO_CHAR)}
# UTF-8 bytes -> GPT-2 characters in one str.translate over the latin-1 decoding of the bytes
_LATIN1_TO_BYTECHAR = {b: c for b, c in enumerate(_BYTE_TO_CHAR)}
_C_SPACE = " \t\n\v\f\r"   # C isspace(), llama.cpp's strip of text next to an RSTRIP token


def _utf8(piece: str) -> bytes:
    """A token's bytes: GGUF strings are bytes, and the reader decodes invalid UTF-8 in a
    token (a partial character, a raw byte) with surrogateescape; this gives the bytes back."""
    return piece.encode("utf-8", "surrogateescape")


def _meta_int(meta: Mapping[str, Any], key: str) -> Optional[int]:
    v = meta.get(key)
    if v is None:
        return None
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):  # llama.cpp: a u32 key
        raise ValueError(f"tokenizer metadata {key!r} is not an integer: {v!r}")
    return int(v)


def _meta_bool(meta: Mapping[str, Any], key: str) -> Optional[bool]:
    v = meta.get(key)
    if v is None:
        return None
    if isinstance(v, (bool, np.bool_)) or isinstance(v, (int, np.integer)):
        return bool(v)
    raise ValueError(f"tokenizer metadata {key!r} is not a bool: {v!r}")


class Tokenizer:
    """A llama.cpp-exact tokenizer over a GGUF vocabulary (see the module docstring).

    Attributes: ``model`` ("llama" or "gpt2"), ``pre`` (the BPE pre-tokenizer
    name or None), ``n_vocab``, ``bos_id`` / ``eos_id`` / ``unk_id`` (int or
    None), ``add_bos``, ``add_eos``, ``add_space_prefix``, ``tokens`` (tuple of
    str), ``token_types`` (int32 array).

    ``special_ids`` names token ids the vocabulary declares in metadata (keys
    ``"fim_pre"`` ... ``"fim_sep"``: a declared fill-in-the-middle token keeps its
    type; ``"eot"``, ``"eom"``: end of turn / message); ``model_name`` is
    ``general.name`` (phi-3 models strip whitespace after split-out tokens, as
    llama.cpp does).

    ``eog_ids`` (frozenset): the ids that end generation, as llama.cpp's
    ``llama_vocab_is_eog``: EOS, the declared end-of-turn / end-of-message ids,
    every token whose text llama.cpp treats as end-of-generation (``<|im_end|>``,
    ``<end_of_turn>``, ``<|eot_id|>``, ``<|endoftext|>``, ...) and the
    fill-in-the-middle pad / repo / separator tokens.
    """

    def __init__(self, *, model: str, tokens: Iterable[str], scores: Optional[ArrayLike] = None,
                 token_types: Optional[ArrayLike] = None, merges: Optional[Sequence[str]] = None,
                 pre: Optional[str] = None, bos_id: Optional[int] = None, eos_id: Optional[int] = None,
                 unk_id: Optional[int] = None, add_bos: Optional[bool] = None, add_eos: Optional[bool] = None,
                 add_space_prefix: Optional[bool] = None, special_ids: Optional[Mapping[str, int]] = None,
                 model_name: Optional[str] = None) -> None:
        if model not in ("llama", "gpt2"):
            raise ValueError(f"unsupported tokenizer model {model!r} (supported: 'llama', 'gpt2')")
        tokens = list(tokens)
        if not tokens:
            raise ValueError("the vocabulary is empty")
        for i, t in enumerate(tokens):
            if not isinstance(t, str):
                raise TypeError(f"token {i} is {type(t).__name__}, expected str")
        n = len(tokens)
        # llama.cpp renames empty tokens so that they can never match text
        tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        self.model = model
        self.n_vocab = n
        self.tokens = tuple(tokens)

        if token_types is None:
            types = np.full(n, TOKEN_NORMAL, dtype=np.int32)
        else:
            types = np.array(token_types, dtype=np.int32, copy=True).reshape(-1)
            if types.size < n:
                raise ValueError(f"token_type has {types.size} entries for {n} tokens")
            types = types[:n]
        self.token_types = types
        if scores is None:
            sc = np.zeros(n, dtype=np.float32)
        else:
            sc = np.array(scores, dtype=np.float32, copy=True).reshape(-1)
            if sc.size < n:
                raise ValueError(f"scores has {sc.size} entries for {n} tokens")
            sc = sc[:n]
        self._scores = [float(s) for s in sc]   # float32 values, exactly as Python floats

        self._vocab: Dict[str, int] = {}
        for i, t in enumerate(tokens):
            j = self._vocab.setdefault(t, i)
            if j != i:
                raise ValueError(f"duplicate token in vocabulary: {t!r} has ids {j} and {i}")

        self.pre: Optional[str] = None
        pre_info: Optional[_Pre] = None
        if model == "gpt2":
            pre_info = self._pre_info(pre)
            self.pre = pre

        # special ids: model defaults, dropped when out of range; metadata overrides when in range
        if model == "llama":
            defaults: Dict[str, Optional[int]] = {"bos": 1, "eos": 2, "unk": 0}
            d_add_bos, d_prefix = True, True
        else:
            defaults = {"bos": 11, "eos": 11, "unk": None}
            d_add_bos, d_prefix = cast(_Pre, pre_info).add_bos, False
        ids: Dict[str, Optional[int]] = {}
        for name, given in (("bos", bos_id), ("eos", eos_id), ("unk", unk_id)):
            v = defaults[name]
            if v is not None and v >= n:
                v = None
            if given is not None and 0 <= int(given) < n:
                v = int(given)
            ids[name] = v
        self.bos_id, self.eos_id, self.unk_id = ids["bos"], ids["eos"], ids["unk"]
        self.add_bos = d_add_bos if add_bos is None else bool(add_bos)
        self.add_eos = False if add_eos is None else bool(add_eos)
        self.add_space_prefix = d_prefix if add_space_prefix is None else bool(add_space_prefix)
        self._clean_spaces = pre_info is not None and pre_info.clean_spaces
        if self.add_bos and self.bos_id is None:
            raise ValueError("add_bos_token is true but the vocabulary has no BOS token id")
        if self.add_eos and self.eos_id is None:
            raise ValueError("add_eos_token is true but the vocabulary has no EOS token id")

        self._init_attrs(dict(special_ids or {}), model_name)
        self._cache: Dict[str, Tuple[int, ...]] = {}
        if model == "llama":
            self._init_spm()
        else:
            self._init_bpe(merges, cast(_Pre, pre_info))

    # -- construction -------------------------------------------------------
    @classmethod
    def from_gguf(cls, source: Union[GGUFFile, StrPath]) -> Tokenizer:
        """Build the tokenizer of a GGUF file (an :class:`orkpy.GGUFFile` or a path).
        Reads metadata only; raises ValueError when the file carries no tokenizer."""
        from .gguf import GGUFFile

        if isinstance(source, GGUFFile):
            return cls._from_metadata(source.metadata, source.path)
        if isinstance(source, (str, bytes, os.PathLike)):
            with GGUFFile(source) as g:
                return cls._from_metadata(g.metadata, g.path)
        raise TypeError(f"from_gguf expects a GGUFFile or a path, got {type(source).__name__}")

    @classmethod
    def _from_metadata(cls, meta: Mapping[str, Any], where: str = "GGUF file") -> Tokenizer:
        model = meta.get("tokenizer.ggml.model")
        if model is None:
            raise ValueError(f"{where}: no tokenizer metadata (tokenizer.ggml.model is missing)")
        if not isinstance(model, str):
            raise ValueError(f"{where}: tokenizer.ggml.model is not a string: {model!r}")
        if model not in ("llama", "gpt2"):
            raise ValueError(f"{where}: unsupported tokenizer model {model!r} (supported: 'llama', 'gpt2')")
        tokens = meta.get("tokenizer.ggml.tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise ValueError(f"{where}: tokenizer.ggml.tokens is missing or not a string array")
        merges = meta.get("tokenizer.ggml.merges")
        if model == "gpt2":
            if not isinstance(merges, list) or not all(isinstance(m, str) for m in merges):
                raise ValueError(f"{where}: tokenizer.ggml.merges is missing or not a string array")
        scores = meta.get("tokenizer.ggml.scores")
        types = meta.get("tokenizer.ggml.token_type")
        pre = meta.get("tokenizer.ggml.pre")
        name = meta.get("general.name")
        try:
            if pre is not None and not isinstance(pre, str):
                raise ValueError(f"tokenizer.ggml.pre is not a string: {pre!r}")
            special = {}
            for what, keys in {**_FIM_KEYS, **_EOG_KEYS}.items():
                for key in keys:
                    v = _meta_int(meta, f"tokenizer.ggml.{key}")
                    if v is not None:
                        special[what] = v
            if model == "gpt2" and pre is None:
                warnings.warn(f"{where}: tokenizer.ggml.pre is missing; using the 'default' pre-tokenizer "
                              "as llama.cpp does (a conversion error: generation quality degrades)", stacklevel=3)
                pre = "default"
            return cls(
                model=model, tokens=tokens, merges=merges, pre=pre,
                scores=None if scores is None else np.asarray(scores),
                token_types=None if types is None else np.asarray(types),
                bos_id=_meta_int(meta, "tokenizer.ggml.bos_token_id"),
                eos_id=_meta_int(meta, "tokenizer.ggml.eos_token_id"),
                unk_id=_meta_int(meta, "tokenizer.ggml.unknown_token_id"),
                add_bos=_meta_bool(meta, "tokenizer.ggml.add_bos_token"),
                add_eos=_meta_bool(meta, "tokenizer.ggml.add_eos_token"),
                add_space_prefix=_meta_bool(meta, "tokenizer.ggml.add_space_prefix"),
                special_ids=special, model_name=name if isinstance(name, str) else None,
            )
        except (ValueError, TypeError) as e:
            raise ValueError(f"{where}: {e}") from None

    @staticmethod
    def _pre_info(pre: Optional[str]) -> _Pre:
        if pre is None or pre == "":
            raise ValueError("tokenizer.ggml.pre is missing: the BPE pre-tokenizer is unknown "
                             f"(supported: {', '.join(PRE_TOKENIZERS)})")
        if pre not in _PRE:
            raise ValueError(f"unsupported BPE pre-tokenizer {pre!r} (supported: {', '.join(PRE_TOKENIZERS)})")
        return _PRE[pre]

    def _init_attrs(self, special_ids: Dict[str, int], model_name: Optional[str]) -> None:
        """llama.cpp's token attributes and the tokens split out of raw text (longest first)."""
        attrs = [_TYPE_ATTR.get(int(t), 0) for t in self.token_types]
        vocab = self._vocab
        for text in _CONTROL_TEXTS:
            i = vocab.get(text)
            if i is not None:
                attrs[i] |= _A_CONTROL
        for what, texts in _FIM_TEXTS.items():
            if not 0 <= special_ids.get(what, -1) < self.n_vocab:
                for text in texts:
                    i = vocab.get(text)
                    if i is not None:
                        attrs[i] |= _A_CONTROL
        self._attrs = attrs
        eog = {i for i in (vocab.get(text) for text in _CONTROL_TEXTS) if i is not None}
        for what in ("fim_pad", "fim_rep", "fim_sep"):
            declared = special_ids.get(what, -1)
            if 0 <= declared < self.n_vocab:
                eog.add(declared)
            else:
                eog.update(i for i in (vocab.get(text) for text in _FIM_TEXTS[what]) if i is not None)
        for i in (self.eos_id, special_ids.get("eot"), special_ids.get("eom")):
            if i is not None and 0 <= i < self.n_vocab:
                eog.add(i)
        self.eog_ids = frozenset(eog)
        self._phi3 = model_name is not None and ("phi-3" in model_name.lower() or "phi3" in model_name.lower())
        self._user_tokens = self._split_tokens(_A_USER, _A_CONTROL | _A_UNKNOWN)
        self._special_tokens: Optional[List[Tuple[str, int, bool]]] = None   # parse_special's, on first use

    def _split_tokens(self, want: int, skip: int) -> List[Tuple[str, int, bool]]:
        """(text, id, rstrip) of the tokens with an attribute in ``want`` and none in ``skip``,
        longest first, as llama.cpp's special-token cache."""
        split = [i for i, a in enumerate(self._attrs) if a & want and not a & skip]
        split.sort(key=lambda i: (-len(_utf8(self.tokens[i])), i))
        keep = ("<unk>", "<s>", "<|endoftext|>")   # llama.cpp's phi-3 rule exempts these
        return [(self.tokens[i], i, self._phi3 and self.tokens[i] not in keep) for i in split]

    def _init_spm(self) -> None:
        # characters c such that some token contains c + "\u2581": a cut in front of a
        # "\u2581" preceded by any other character can never be crossed by a merge
        glue: Set[str] = set()
        for t in self.tokens:
            k = t.find(_SPACE, 1)
            while k != -1:
                glue.add(t[k - 1])
                k = t.find(_SPACE, k + 1)
        if glue:
            cls = "".join(re.escape(c) for c in sorted(glue))
            self._spm_split = re.compile(f"(?<![{cls}])(?={_SPACE})")
        else:
            self._spm_split = re.compile(f"(?={_SPACE})")
        self._glue = frozenset(glue)
        byte_ids: List[Optional[int]] = []
        for b in range(256):
            i = self._vocab.get(f"<0x{b:02X}>")
            if i is None:   # llama.cpp falls back to the byte itself as a token
                i = self._vocab.get(bytes([b]).decode("utf-8", "surrogateescape"))
            byte_ids.append(i)
        self._byte_ids = byte_ids

    def _init_bpe(self, merges: Optional[Sequence[str]], pre: _Pre) -> None:
        if merges is None:
            raise ValueError("a gpt2 (BPE) vocabulary needs tokenizer.ggml.merges")
        self._ignore_merges = pre.ignore_merges
        self._pre_exprs = [_compile_expr(e) for e in _PRE_EXPRS[pre.exprs]]
        ranks: Dict[Tuple[str, str], int] = {}
        for r, m in enumerate(merges):
            if not isinstance(m, str):
                raise TypeError(f"merge {r} is {type(m).__name__}, expected str")
            k = m.find(" ", 1)
            pair = (m[:k], m[k + 1:]) if k != -1 else ("", "")
            ranks.setdefault(pair, r)
        self._ranks = ranks
        # llama.cpp: a symbol that is not a token falls back to its UTF-8 bytes as one-byte tokens
        self._byte_tok = [self._vocab.get(bytes([b]).decode("utf-8", "surrogateescape")) for b in range(256)]

    # -- encoding -----------------------------------------------------------
    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> NDArray[np.int32]:
        """Token ids (int32 array) of ``text``, as llama.cpp's
        ``common_tokenize(ctx, text, add_special, parse_special)``: with ``parse_special`` the
        control tokens written in the text (``<|im_start|>``, ``<start_of_turn>``, ...) are
        split out as their ids too (a chat prompt), not only the user-defined ones."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        if not isinstance(add_special, (bool, np.bool_)):
            raise TypeError(f"add_special must be a bool, got {type(add_special).__name__}")
        if not isinstance(parse_special, (bool, np.bool_)):
            raise TypeError(f"parse_special must be a bool, got {type(parse_special).__name__}")
        # llama.cpp works on UTF-8; a lone surrogate has no UTF-8 form
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"text is not valid Unicode (lone surrogate at index {e.start})") from None
        out: List[int] = []
        if add_special and self.add_bos:
            out.append(cast(int, self.bos_id))  # add_bos implies a BOS id (checked in __init__)
        if parse_special and self._special_tokens is None:
            self._special_tokens = self._split_tokens(_A_USER | _A_CONTROL | _A_UNKNOWN, 0)
        fragments = self._partition(text, self._special_tokens if parse_special else None) if text else []
        if self.model == "llama":
            prev_special = True
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                    prev_special = True
                    continue
                if self.add_space_prefix and prev_special:
                    frag = " " + frag
                self._spm_tokenize(frag.replace(" ", _SPACE), out)
                prev_special = False
        else:
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                else:
                    self._bpe_tokenize(frag, out)
        if add_special and self.add_eos:
            out.append(cast(int, self.eos_id))
        return np.array(out, dtype=np.int32)

    def _partition(self, text: str, split: Optional[List[Tuple[str, int, bool]]] = None) -> List[Union[str, int]]:
        """Split user-defined tokens (or the tokens of ``split``) out of the text: a list of str and
        int (token id).

        llama.cpp takes the tokens longest first, each splitting every text fragment left at
        its leftmost non-overlapping occurrences. Equivalently, over the whole text: an
        occurrence of the current token is taken iff it overlaps nothing taken before (it then
        lies inside one fragment) and starts at or after the end of the last one it took."""
        users = [u for u in (self._user_tokens if split is None else split) if u[0] in text]
        if not users:
            return [text] if text else []
        starts: List[int] = []                       # taken spans, sorted, disjoint
        spans: List[Tuple[int, int, Optional[int]]] = []   # (start, end, token id or None: dropped)
        n = len(text)

        def free(a: int, b: int) -> bool:
            k = bisect.bisect_right(starts, a - 1)   # spans starting at or after a
            if k < len(spans) and spans[k][0] < b:
                return False
            return k == 0 or spans[k - 1][1] <= a

        def take(a: int, b: int, tid: Optional[int]) -> None:
            k = bisect.bisect_left(starts, a)
            starts.insert(k, a)
            spans.insert(k, (a, b, tid))

        for word, tid, rstrip in users:
            p = text.find(word)
            while p != -1:
                e = p + len(word)
                if not free(p, e):
                    p = text.find(word, p + 1)
                    continue
                take(p, e, tid)
                if rstrip:   # drop the whitespace after it, up to the end of its fragment
                    k = bisect.bisect_right(starts, p)
                    limit = spans[k][0] if k < len(spans) else n
                    s = e
                    while s < limit and text[s] in _C_SPACE:
                        s += 1
                    if s > e:
                        take(e, s, None)
                        e = s
                p = text.find(word, e)
        out: List[Union[str, int]] = []
        pos = 0
        for a, b, got in spans:
            if a > pos:
                out.append(text[pos:a])
            if got is not None:
                out.append(got)
            pos = b
        if pos < n:
            out.append(text[pos:])
        return out

    def _cached(self, piece: str, fn: Callable[[str], Tuple[int, ...]]) -> Tuple[int, ...]:
        ids = self._cache.get(piece)
        if ids is None:
            ids = fn(piece)
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[piece] = ids
        return ids

    # SPM ---------------------------------------------------------------------
    def _spm_tokenize(self, text: str, out: List[int]) -> None:
        cache = self._cache
        for piece in self._spm_split.split(text):
            if not piece:
                continue
            ids = cache.get(piece)
            if ids is None:
                ids = self._cached(piece, self._spm_piece)
            out.extend(ids)

    def _spm_piece(self, piece: str) -> Tuple[int, ...]:
        vocab, scores = self._vocab, self._scores
        syms = list(piece)
        n = len(syms)
        if n > 1:
            prev = list(range(-1, n - 1))
            nxt = list(range(1, n + 1))
            nxt[-1] = -1
            # (-score, left, right, merged length): best score first, then leftmost
            heap: List[Tuple[float, int, int, int]] = []
            for i in range(n - 1):
                s = syms[i] + syms[i + 1]
                tid = vocab.get(s)
                if tid is not None:
                    heap.append((-scores[tid], i, i + 1, len(s)))
            heapq.heapify(heap)
            while heap:
                _, left, right, size = heapq.heappop(heap)
                sl, sr = syms[left], syms[right]
                if not sl or not sr or len(sl) + len(sr) != size:
                    continue
                syms[left] = sl + sr
                syms[right] = ""
                r2 = nxt[right]
                nxt[left] = r2
                if r2 >= 0:
                    prev[r2] = left
                p = prev[left]
                for a, b in ((p, left), (left, r2)):
                    if a >= 0 and b >= 0:
                        s = syms[a] + syms[b]
                        tid = vocab.get(s)
                        if tid is not None:
                            heapq.heappush(heap, (-scores[tid], a, b, len(s)))
        ids = []
        for s in syms:
            if not s:
                continue
            tid = vocab.get(s)
            if tid is not None:
                ids.append(tid)
                continue
            # only single, unmerged characters can be missing: fall back to their bytes
            for b in s.encode("utf-8"):
                bid = self._byte_ids[b]
                if bid is None:
                    if self.unk_id is None:
                        raise ValueError(f"character {s!r} is not in the vocabulary and byte 0x{b:02X} "
                                         "has no <0xXX> token")
                    bid = self.unk_id
                ids.append(bid)
        return tuple(ids)

    # BPE ---------------------------------------------------------------------
    def _pretokenize(self, text: str) -> List[str]:
        """The words llama.cpp's pre-tokenizer splits ``text`` into (see the module docstring)."""
        cuts = [0, len(text)]
        views: Dict[bool, str] = {}
        for collapsed, rx in self._pre_exprs:
            s = views.get(collapsed)
            if s is None:
                s = views[collapsed] = _translated(text, _COLLAPSE if collapsed else _WIDE, not collapsed)
            new = [0]
            add = new.append
            finditer = rx.finditer
            for k in range(len(cuts) - 1):
                a, b = cuts[k], cuts[k + 1]
                for m in finditer(s, a, b):
                    i, j = m.span()
                    if i != j:
                        if i != new[-1]:
                            add(i)
                        add(j)
                if b != new[-1]:
                    add(b)
            cuts = new
        return [text[cuts[k]:cuts[k + 1]] for k in range(len(cuts) - 1)]

    def _bpe_tokenize(self, text: str, out: List[int]) -> None:
        cache = self._cache
        for w in self._pretokenize(text):
            ids = cache.get(w)
            if ids is None:
                ids = self._cached(w, self._bpe_piece)
            out.extend(ids)

    def _bpe_piece(self, word: str) -> Tuple[int, ...]:
        mapped = word.encode("utf-8").decode("latin-1").translate(_LATIN1_TO_BYTECHAR)
        vocab, ranks = self._vocab, self._ranks
        if self._ignore_merges:
            tid = vocab.get(mapped)
            if tid is not None:
                return (tid,)
        syms = list(mapped)
        n = len(syms)
        if n > 1:
            prev = list(range(-1, n - 1))
            nxt = list(range(1, n + 1))
            nxt[-1] = -1
            # (rank, left, right, merged text): lowest rank first, then leftmost
            heap: List[Tuple[int, int, int, str]] = []
            for i in range(n - 1):
                r = ranks.get((syms[i], syms[i + 1]))
                if r is not None:
                    heap.append((r, i, i + 1, syms[i] + syms[i + 1]))
            heapq.heapify(heap)
            while heap:
                _, left, right, text = heapq.heappop(heap)
                sl, sr = syms[left], syms[right]
                if not sl or not sr or sl + sr != text:
                    continue
                syms[left] = text
                syms[right] = ""
                r2 = nxt[right]
                nxt[left] = r2
                if r2 >= 0:
                    prev[r2] = left
                p = prev[left]
                if p >= 0:
                    r = ranks.get((syms[p], text))
                    if r is not None:
                        heapq.heappush(heap, (r, p, left, syms[p] + text))
                if r2 >= 0:
                    r = ranks.get((text, syms[r2]))
                    if r is not None:
                        heapq.heappush(heap, (r, left, r2, text + syms[r2]))
        ids = []
        for s in syms:
            if not s:
                continue
            tid = vocab.get(s)
            if tid is not None:
                ids.append(tid)
                continue
            # llama.cpp: each UTF-8 byte of the symbol as a one-byte token, if there is one
            for b in s.encode("utf-8"):
                bid = self._byte_tok[b]
                if bid is not None:
                    ids.append(bid)
        return tuple(ids)

    # -- decoding -----------------------------------------------------------
    def token_to_piece(self, token_id: int, special: bool = False) -> bytes:
        """The bytes llama.cpp's ``llama_token_to_piece(..., lstrip=0, special)`` gives for one id."""
        tid = self._check_id(token_id, 0)
        return self._piece(tid, special)

    def _piece(self, tid: int, special: bool) -> bytes:
        attr = self._attrs[tid]
        text = self.tokens[tid]
        if attr & (_A_UNKNOWN | _A_CONTROL):
            return _utf8(text) if special else b""
        if attr & _A_USER:
            return _utf8(text)
        if attr & _A_NORMAL:
            if self.model == "llama":
                return _utf8(text.replace(_SPACE, " "))
            out = bytearray()
            for c in text:
                b = _CHAR_TO_BYTE.get(c)
                if b is None:   # llama.cpp's marker for a character outside the byte table (an invalid
                    h = "efbfbd" if "\udc80" <= c <= "\udcff" else _utf8(c).hex()   # byte reads as U+FFFD)
                    out += b"[UNK_BYTE_0x" + h.encode() + _utf8(text) + b"]"
                else:
                    out.append(b)
            return bytes(out)
        if attr & _A_BYTE:
            try:
                return bytes([int(text[3:5], 16)])
            except ValueError:
                return b""
        return b""   # unused / undefined tokens render as nothing

    def _check_id(self, t: object, k: int) -> int:
        if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
            raise TypeError(f"token id at index {k} is {type(t).__name__}, expected int")
        t = int(t)
        if not 0 <= t < self.n_vocab:
            raise ValueError(f"token id {t} at index {k} is out of range [0, {self.n_vocab})")
        return t

    def decode(self, ids: Iterable[int], special: bool = False, continuation: bool = False) -> str:
        """Text of token ids, as llama.cpp's ``common_detokenize(ctx, ids, special)``: control
        and unknown tokens are dropped unless ``special``; for SPM vocabularies the prefix space
        of the first token is removed (llama.cpp does so only when that first token is not
        BOS, so ``decode(encode(s)) == " " + s`` there) unless ``continuation`` (the ids follow
        earlier text: a generated continuation keeps its leading space); BPE vocabularies with
        llama.cpp's ``clean_spaces`` get its clean-up. Invalid UTF-8 becomes U+FFFD.
        :meth:`stream` gives the same text piece by piece."""
        if isinstance(ids, (str, bytes)):
            raise TypeError(f"decode expects a sequence of token ids, got {type(ids).__name__}")
        if isinstance(ids, np.ndarray):
            if ids.ndim != 1:
                raise ValueError(f"decode expects a 1-D array of token ids, got shape {ids.shape}")
            if ids.dtype.kind not in "iu":
                raise TypeError(f"decode expects integer token ids, got dtype {ids.dtype}")
            ids = ids.tolist()
        try:
            ids = list(ids)
        except TypeError:
            raise TypeError(f"decode expects a sequence of token ids, got {type(ids).__name__}") from None
        out = bytearray()
        remove_space = self.add_space_prefix and not continuation
        for k, t in enumerate(ids):
            p = self._piece(self._check_id(t, k), special)
            if remove_space and p[:1] == b" ":
                p = p[1:]
            remove_space = False
            out += p
        if self._clean_spaces:
            out = _clean_spaces(out)
        return out.decode("utf-8", errors="replace")

    def stream(self, special: bool = False, continuation: bool = False) -> TextStream:
        """An incremental :meth:`decode`: ``push(id)`` returns the text that became final,
        ``flush()`` the rest (see :class:`TextStream`)."""
        return TextStream(self, special, continuation)

    def __len__(self) -> int:
        return self.n_vocab

    def __repr__(self) -> str:
        pre = f", pre={self.pre!r}" if self.pre else ""
        return (f"Tokenizer(model={self.model!r}{pre}, n_vocab={self.n_vocab}, bos_id={self.bos_id}, "
                f"eos_id={self.eos_id}, add_bos={self.add_bos})")


_CUT_AFTER = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqstuwxyz0123456789")


class TextStream:
    """The text of a growing sequence of token ids, as it becomes final (streaming output).

    ``push(id)`` returns the new text, ``flush()`` what is left at the end; their
    concatenation is ``tok.decode(ids, special, continuation)`` exactly. A piece that ends
    inside a UTF-8 character waits for the rest of it (``codecs``' incremental decoder, the
    same U+FFFD replacements as a one-shot decode). With llama.cpp's space clean-up (BPE
    vocabularies marked ``clean_spaces``) the text is final only up to the last byte that is
    an ASCII letter or digit other than ``r`` and ``v``: the clean-up only ever removes a
    space next to a ``?!.,'`` pattern of at most four bytes, and a pattern that crosses a
    boundary with such a byte on its left does not exist (``r``/``v`` end `` 're`` / `` 've``
    one byte early), so cleaning the text in parts cut there equals cleaning it whole."""

    def __init__(self, tok: Tokenizer, special: bool = False, continuation: bool = False) -> None:
        self._tok, self._special = tok, bool(special)
        self._strip = tok.add_space_prefix and not continuation   # the first piece's prefix space
        self._clean = tok._clean_spaces
        self._pending = bytearray()   # raw bytes not cleaned and emitted yet
        self._n = 0
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def push(self, token_id: int) -> str:
        p = self._tok._piece(self._tok._check_id(token_id, self._n), self._special)
        if self._n == 0 and self._strip and p[:1] == b" ":
            p = p[1:]
        self._n += 1
        self._pending += p
        if not self._clean:
            out, self._pending = self._pending, bytearray()
            return self._utf8.decode(bytes(out))
        cut = len(self._pending)
        while cut and self._pending[cut - 1] not in _CUT_AFTER:
            cut -= 1
        if not cut:
            return ""
        done, self._pending = self._pending[:cut], self._pending[cut:]
        return self._utf8.decode(bytes(_clean_spaces(done)))

    def flush(self) -> str:
        """The rest of the text (pushes after it continue the same text)."""
        rest = _clean_spaces(self._pending) if self._clean and self._pending else self._pending
        self._pending = bytearray()
        return self._utf8.decode(bytes(rest), final=True)


def _clean_spaces(t: bytearray) -> bytearray:
    """llama.cpp's detokenizer clean-up (three passes over the bytes, as it writes them)."""
    # " ?", " !", " .", " ," lose the space
    out = bytearray(t[:1])
    for i in range(1, len(t)):
        if t[i - 1] == 0x20 and t[i] in b"?!.,":
            out.pop()
        out.append(t[i])
    # " ' " -> "'"
    t, out = out, bytearray(out[:1])
    i = 1
    while i < len(t):
        x = t[i]
        if x == 0x27 and i + 1 < len(t) and t[i - 1] == 0x20 and t[i + 1] == 0x20:
            out.pop()
            t[i + 1] = 0   # llama.cpp overwrites the skipped space with NUL in place
            out.append(x)
            i += 2
            continue
        out.append(x)
        i += 1
    # " 's", " 'm", " 're", " 've" lose the space (" 't", " 'd", " 'll" keep it)
    t, out = out, bytearray(out[:1])
    for i in range(1, len(t)):
        x = t[i]
        if t[i - 1] == 0x20 and x == 0x27 and i + 1 < len(t):
            x1 = t[i + 1]
            if x1 in b"sm" or (i + 2 < len(t) and bytes(t[i + 1:i + 3]) in (b"re", b"ve")):
                out.pop()
        out.append(x)
    return out
