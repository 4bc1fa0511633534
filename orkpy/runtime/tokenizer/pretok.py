"""llama.cpp's BPE pre-tokenizers: the regular expressions of each ``tokenizer.ggml.pre`` type, the
Unicode classes they match on (text collapsed as llama.cpp does), and the splitting itself."""
from __future__ import annotations

import base64
import bisect
import re
import zlib
from typing import Dict, List, Sequence, Tuple

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
            raise RuntimeError("orkpy.runtime.tokenizer._unicode_classes is corrupt")
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


def compile_exprs(pre: _Pre) -> List[Tuple[bool, re.Pattern[str]]]:
    """The compiled expressions of a pre-tokenizer type, in the order llama.cpp applies them."""
    return [_compile_expr(e) for e in _PRE_EXPRS[pre.exprs]]


def pretokenize(exprs: Sequence[Tuple[bool, re.Pattern[str]]], text: str) -> List[str]:
    """The words llama.cpp's pre-tokenizer splits ``text`` into (see orkpy.runtime.tokenizer's docstring):
    each expression of ``exprs`` splits the pieces the previous ones left, text between matches
    is a piece too."""
    cuts = [0, len(text)]
    views: Dict[bool, str] = {}
    for collapsed, rx in exprs:
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
