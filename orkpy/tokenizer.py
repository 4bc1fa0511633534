"""Tokenizers built from a GGUF file's own vocabulary, giving llama.cpp's token ids.

``Tokenizer.from_gguf(path_or_gguf_file)`` reads only the ``tokenizer.ggml.*``
metadata. ``tok.encode(text)`` behaves like llama.cpp's
``common_tokenize(ctx, text, add_special=True, parse_special=False)`` and
``tok.decode(ids)`` like ``common_detokenize(ctx, ids, special=False)``.

Two vocabulary kinds are supported:

``tokenizer.ggml.model = "llama"`` (SentencePiece-style, llama.cpp's SPM)
    A space is put in front of the text (``tokenizer.ggml.add_space_prefix``,
    default true), every ``" "`` becomes ``"\u2581"``, the text is split into
    code points and adjacent symbols are merged greedily: always the pair whose
    concatenation is a vocabulary token of the highest score, the leftmost one
    on ties. A final symbol that is not a token is emitted as its UTF-8 bytes
    through the ``<0xXX>`` byte tokens.

    Speed-up, exact by construction: a merged symbol is always a vocabulary
    token, so no merge can ever cover the boundary between two adjacent
    characters ``a b`` unless some token contains the substring ``ab``. Before
    tokenizing, the text is cut in front of every ``"\u2581"`` whose left
    neighbour ``c`` is such that no token contains ``c + "\u2581"``; the pieces
    are tokenized independently (and cached). This yields exactly the same
    merges as running the whole text as one sequence, whatever the
    vocabulary (for one containing ``"\u2581\u2581"``, runs of spaces simply stay
    in one piece). For stories260K no token has a ``"\u2581"`` after its first
    character, so every word is its own piece.

``tokenizer.ggml.model = "gpt2"`` (byte-level BPE, llama.cpp's BPE)
    The text is split by the pre-tokenizer regex of ``tokenizer.ggml.pre``
    (the Qwen2 family is supported), each piece's UTF-8 bytes are mapped to
    printable characters with GPT-2's byte-to-unicode table and merged by
    rank (position in ``tokenizer.ggml.merges``, lowest first, leftmost on
    ties). Results are cached per piece.

Specials: BOS is prepended iff ``add_special`` and the vocabulary's add_bos
(``tokenizer.ggml.add_bos_token``; default true for "llama", false for the
Qwen2 BPE); EOS is appended iff ``add_special`` and
``tokenizer.ggml.add_eos_token`` is true (default false, as in llama.cpp; false
for every file we ship against). User-defined tokens (token type 4) are split
out of the text before tokenization, as llama.cpp does even with
``parse_special=False``; control tokens written in the text are tokenized as
plain text.

Known, documented limits against llama.cpp: llama.cpp matches ``\\p{L}`` /
``\\p{N}`` / ``\\s`` with tables generated from the Python ``regex`` module at
the time it was built; this module uses the installed ``regex``, so a code point
assigned in a newer Unicode version than llama.cpp's tables may be classified
differently. The per-model token attributes that llama.cpp sets by model name
(phi-3 RSTRIP, jina LSTRIP, ...) are not applied.
"""
from __future__ import annotations

import heapq
import os
from typing import (TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple, Union,
                    cast)

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._typing import StrPath

if TYPE_CHECKING:
    from .gguf import GGUFFile

__all__ = ["Tokenizer"]

# GGUF token types (llama.cpp's llama_token_type)
TOKEN_UNDEFINED, TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = range(7)

_SPACE = "\u2581"

# llama.cpp LLAMA_VOCAB_PRE_TYPE_QWEN2: the tokenizer.json regex with the
# case-insensitive group spelled out (checked against src/llama-vocab.cpp).
_QWEN2_PATTERN = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
    r"|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+"
    r"|\s+(?!\S)"
    r"|\s+"
)

# tokenizer.ggml.pre values that llama.cpp maps to LLAMA_VOCAB_PRE_TYPE_QWEN2 with
# add_bos false and clean_spaces false (the only BPE pre-tokenizer implemented here).
_PRE_PATTERNS = {name: _QWEN2_PATTERN for name in ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2")}

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
    """

    def __init__(self, *, model: str, tokens: Iterable[str], scores: Optional[ArrayLike] = None,
                 token_types: Optional[ArrayLike] = None, merges: Optional[Sequence[str]] = None,
                 pre: Optional[str] = None, bos_id: Optional[int] = None, eos_id: Optional[int] = None,
                 unk_id: Optional[int] = None, add_bos: Optional[bool] = None, add_eos: Optional[bool] = None,
                 add_space_prefix: Optional[bool] = None) -> None:
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

        # special ids: model defaults, dropped when out of range; metadata overrides when in range
        if model == "llama":
            defaults: Dict[str, Optional[int]] = {"bos": 1, "eos": 2, "unk": 0}
            d_add_bos, d_prefix = True, True
        else:
            defaults = {"bos": 11, "eos": 11, "unk": None}
            d_add_bos, d_prefix = False, False
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
        if self.add_bos and self.bos_id is None:
            raise ValueError("add_bos_token is true but the vocabulary has no BOS token id")
        if self.add_eos and self.eos_id is None:
            raise ValueError("add_eos_token is true but the vocabulary has no EOS token id")

        # user-defined tokens are split out of raw text first, longest first
        user = [i for i in range(n) if types[i] == TOKEN_USER_DEFINED]
        user.sort(key=lambda i: (-len(_utf8(tokens[i])), i))
        self._user_tokens = [(tokens[i], i) for i in user]

        self._cache: Dict[str, Tuple[int, ...]] = {}
        self.pre: Optional[str] = None
        if model == "llama":
            self._init_spm()
        else:
            self._init_bpe(merges, pre)

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
        try:
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
            )
        except (ValueError, TypeError) as e:
            raise ValueError(f"{where}: {e}") from None

    def _init_spm(self) -> None:
        # characters c such that some token contains c + "\u2581": a cut in front of a
        # "\u2581" preceded by any other character can never be crossed by a merge
        glue: Set[str] = set()
        for t in self.tokens:
            k = t.find(_SPACE, 1)
            while k != -1:
                glue.add(t[k - 1])
                k = t.find(_SPACE, k + 1)
        import regex

        if glue:
            cls = "".join(regex.escape(c) for c in sorted(glue))
            self._spm_split = regex.compile(f"(?<![{cls}])(?={_SPACE})")
        else:
            self._spm_split = regex.compile(f"(?={_SPACE})")
        self._glue = frozenset(glue)
        byte_ids: List[Optional[int]] = []
        for b in range(256):
            i = self._vocab.get(f"<0x{b:02X}>")
            if i is None and b < 0x80:
                i = self._vocab.get(chr(b))
            byte_ids.append(i)
        self._byte_ids = byte_ids

    def _init_bpe(self, merges: Optional[Sequence[str]], pre: Optional[str]) -> None:
        if merges is None:
            raise ValueError("a gpt2 (BPE) vocabulary needs tokenizer.ggml.merges")
        if pre is None or pre == "":
            raise ValueError("tokenizer.ggml.pre is missing: the BPE pre-tokenizer is unknown "
                             f"(supported: {', '.join(sorted(_PRE_PATTERNS))})")
        if pre not in _PRE_PATTERNS:
            raise ValueError(f"unsupported BPE pre-tokenizer {pre!r} "
                             f"(supported: {', '.join(sorted(_PRE_PATTERNS))})")
        import regex

        self.pre = pre
        self._pre_re = regex.compile(_PRE_PATTERNS[pre])
        ranks: Dict[Tuple[str, str], int] = {}
        for r, m in enumerate(merges):
            if not isinstance(m, str):
                raise TypeError(f"merge {r} is {type(m).__name__}, expected str")
            k = m.find(" ", 1)
            pair = (m[:k], m[k + 1:]) if k != -1 else ("", "")
            ranks.setdefault(pair, r)
        self._ranks = ranks

    # -- encoding -----------------------------------------------------------
    def encode(self, text: str, add_special: bool = True) -> NDArray[np.int32]:
        """Token ids (int32 array) of ``text``, as llama.cpp's
        ``common_tokenize(ctx, text, add_special, parse_special=false)``."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        if not isinstance(add_special, (bool, np.bool_)):
            raise TypeError(f"add_special must be a bool, got {type(add_special).__name__}")
        # llama.cpp works on UTF-8; a lone surrogate has no UTF-8 form
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"text is not valid Unicode (lone surrogate at index {e.start})") from None
        out: List[int] = []
        if add_special and self.add_bos:
            out.append(cast(int, self.bos_id))  # add_bos implies a BOS id (checked in __init__)
        fragments = self._partition(text) if text else []
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

    def _partition(self, text: str) -> List[Union[str, int]]:
        """Split user-defined tokens out of the text: a list of str and int (token id)."""
        frags: List[Union[str, int]] = [text]
        for word, tid in self._user_tokens:
            nxt: List[Union[str, int]] = []
            for f in frags:
                if isinstance(f, int) or word not in f:
                    nxt.append(f)
                    continue
                parts = f.split(word)
                for k, p in enumerate(parts):
                    if k:
                        nxt.append(tid)
                    if p:
                        nxt.append(p)
            frags = nxt
        return frags

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
    def _bpe_tokenize(self, text: str, out: List[int]) -> None:
        cache = self._cache
        pos = 0
        for m in self._pre_re.finditer(text):
            a, b = m.span()
            if a > pos:   # text no alternative matched (cannot happen with the Qwen2 regex)
                self._bpe_word(text[pos:a], out)
            if b > a:
                w = text[a:b]
                ids = cache.get(w)
                if ids is None:
                    ids = self._cached(w, self._bpe_piece)
                out.extend(ids)
            pos = b
        if pos < len(text):
            self._bpe_word(text[pos:], out)

    def _bpe_word(self, w: str, out: List[int]) -> None:
        out.extend(self._cached(w, self._bpe_piece))

    def _bpe_piece(self, word: str) -> Tuple[int, ...]:
        mapped = word.encode("utf-8").decode("latin-1").translate(_LATIN1_TO_BYTECHAR)
        vocab, ranks = self._vocab, self._ranks
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
            # llama.cpp: try each UTF-8 byte of the symbol as a one-byte token, drop the rest
            for b in s.encode("utf-8"):
                if b < 0x80:
                    bid = vocab.get(chr(b))
                    if bid is not None:
                        ids.append(bid)
        return tuple(ids)

    # -- decoding -----------------------------------------------------------
    def token_to_piece(self, token_id: int, special: bool = False) -> bytes:
        """The bytes llama.cpp's ``llama_token_to_piece(..., lstrip=0, special)`` gives for one id."""
        tid = self._check_id(token_id, 0)
        return self._piece(tid, special)

    def _piece(self, tid: int, special: bool) -> bytes:
        ty = int(self.token_types[tid])
        text = self.tokens[tid]
        if ty in (TOKEN_UNKNOWN, TOKEN_CONTROL):
            return _utf8(text) if special else b""
        if ty == TOKEN_USER_DEFINED:
            return _utf8(text)
        if ty == TOKEN_NORMAL:
            if self.model == "llama":
                return _utf8(text.replace(_SPACE, " "))
            out = bytearray()
            for c in text:
                b = _CHAR_TO_BYTE.get(c)
                if b is None:
                    out += _utf8(c)
                else:
                    out.append(b)
            return bytes(out)
        if ty == TOKEN_BYTE:
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

    def decode(self, ids: Iterable[int], special: bool = False) -> str:
        """Text of token ids, as llama.cpp's ``common_detokenize(ctx, ids, special)``: control
        and unknown tokens are dropped unless ``special``; for SPM vocabularies the prefix space
        of the first token is removed (llama.cpp does so only when that first token is not
        BOS, so ``decode(encode(s)) == " " + s`` there). Invalid UTF-8 becomes U+FFFD."""
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
        remove_space = self.add_space_prefix
        for k, t in enumerate(ids):
            p = self._piece(self._check_id(t, k), special)
            if remove_space and p[:1] == b" ":
                p = p[1:]
            remove_space = False
            out += p
        return out.decode("utf-8", errors="replace")

    def __len__(self) -> int:
        return self.n_vocab

    def __repr__(self) -> str:
        pre = f", pre={self.pre!r}" if self.pre else ""
        return (f"Tokenizer(model={self.model!r}{pre}, n_vocab={self.n_vocab}, bos_id={self.bos_id}, "
                f"eos_id={self.eos_id}, add_bos={self.add_bos})")
