"""The Tokenizer: a GGUF vocabulary read as llama.cpp reads it, special tokens split out of the text, then
the SPM (spm.py) or BPE (bpe.py, after the pre-tokenizer of pretok.py) merges; decoding, one shot or
streamed (stream.py). The behaviour is described in orkpy.runtime.tokenizer's docstring."""
from __future__ import annotations

import bisect
import os
import warnings
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union, cast

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ..._typing import StrPath
from . import bpe, spm
from ._tables import (_A_BYTE, _A_CONTROL, _A_NORMAL, _A_UNKNOWN, _A_USER, _C_SPACE, _CACHE_LIMIT, _CHAR_TO_BYTE,
                      _CONTROL_TEXTS, _EOG_KEYS, _FIM_KEYS, _FIM_TEXTS, _SPACE, _TYPE_ATTR, TOKEN_NORMAL, _meta_bool,
                      _meta_int, _utf8)
from .pretok import _PRE, PRE_TOKENIZERS, _Pre, compile_exprs, pretokenize
from .stream import TextStream, _clean_spaces

if TYPE_CHECKING:
    from ...formats.gguf import GGUFFile


def _span_start(span: Tuple[int, int, Optional[int]]) -> int:
    return span[0]


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
        from ...formats.gguf import GGUFFile

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
        self._glue = spm.glue_chars(self.tokens)
        self._spm_split = spm.splitter(self._glue)
        self._byte_ids = spm.byte_ids(self._vocab)

    def _init_bpe(self, merges: Optional[Sequence[str]], pre: _Pre) -> None:
        if merges is None:
            raise ValueError("a gpt2 (BPE) vocabulary needs tokenizer.ggml.merges")
        self._ignore_merges = pre.ignore_merges
        self._pre_exprs = compile_exprs(pre)
        self._ranks = bpe.merge_ranks(merges)
        self._byte_tok = bpe.byte_tokens(self._vocab)

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
        lies inside one fragment) and starts at or after the end of the last one it took.

        Cost: O(n + S) per token that occurs in the text (S: spans taken so far), never
        O(n * len(token)) or O(S^2): an occurrence that overlaps an earlier span resumes the
        search at that span's end (every occurrence starting before it overlaps it too), and
        each token's new spans are merged into the sorted list once, not inserted one by one.
        Gemma-3's 30 runs of 2..31 spaces (newlines, tabs) over a long run of spaces thus cost
        one jump per 31-space span each, not one search per character."""
        toks = self._user_tokens if split is None else split
        if len(toks) > 32:   # parse_special: thousands of tokens; skip those whose first character is absent
            chars = set(text)
            toks = [u for u in toks if u[0][0] in chars]
        users = [u for u in toks if u[0] in text]
        if not users:
            return [text] if text else []
        # taken spans, sorted, disjoint: (start, end, token id or None: dropped whitespace)
        spans: List[Tuple[int, int, Optional[int]]] = []
        starts: List[int] = []
        n = len(text)
        for word, tid, rstrip in users:
            new: List[Tuple[int, int, Optional[int]]] = []
            m = len(spans)
            p = text.find(word)
            while p != -1:
                e = p + len(word)
                k = bisect.bisect_right(starts, p)   # spans[k:] start after p
                if k and spans[k - 1][1] > p:        # a span holds p: skip past it
                    p = text.find(word, spans[k - 1][1])
                    continue
                if k < m and starts[k] < e:          # a span starts inside the occurrence
                    p = text.find(word, spans[k][1])
                    continue
                new.append((p, e, tid))
                if rstrip:   # drop the whitespace after it, up to the end of its fragment
                    limit = starts[k] if k < m else n
                    s = e
                    while s < limit and text[s] in _C_SPACE:
                        s += 1
                    if s > e:
                        new.append((e, s, None))
                        e = s
                p = text.find(word, e)
            if new:
                spans += new
                spans.sort(key=_span_start)   # two sorted runs: a linear merge
                starts = [sp[0] for sp in spans]
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
        return spm.merge(piece, self._vocab, self._scores, self._byte_ids, self.unk_id)

    # BPE ---------------------------------------------------------------------
    def _pretokenize(self, text: str) -> List[str]:
        """The words llama.cpp's pre-tokenizer splits ``text`` into (see the module docstring)."""
        return pretokenize(self._pre_exprs, text)

    def _bpe_tokenize(self, text: str, out: List[int]) -> None:
        cache = self._cache
        for w in self._pretokenize(text):
            ids = cache.get(w)
            if ids is None:
                ids = self._cached(w, self._bpe_piece)
            out.extend(ids)

    def _bpe_piece(self, word: str) -> Tuple[int, ...]:
        return bpe.merge(word, self._vocab, self._ranks, self._ignore_merges, self._byte_tok)

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
