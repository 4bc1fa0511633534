"""llama.cpp's byte-level BPE tokenizer (``tokenizer.ggml.model = "gpt2"``): a pre-tokenized word's UTF-8
bytes as GPT-2's printable characters, merged by rank (see orkpy.runtime.tokenizer's docstring)."""
from __future__ import annotations

import heapq
from typing import Dict, List, Optional, Sequence, Tuple

from ._tables import _LATIN1_TO_BYTECHAR


def merge_ranks(merges: Sequence[str]) -> Dict[Tuple[str, str], int]:
    """(left, right) -> rank: the position of its first line in ``tokenizer.ggml.merges``."""
    ranks: Dict[Tuple[str, str], int] = {}
    for r, m in enumerate(merges):
        if not isinstance(m, str):
            raise TypeError(f"merge {r} is {type(m).__name__}, expected str")
        k = m.find(" ", 1)
        pair = (m[:k], m[k + 1:]) if k != -1 else ("", "")
        ranks.setdefault(pair, r)
    return ranks


def byte_tokens(vocab: Dict[str, int]) -> List[Optional[int]]:
    """llama.cpp: a symbol that is not a token falls back to its UTF-8 bytes as one-byte tokens."""
    return [vocab.get(bytes([b]).decode("utf-8", "surrogateescape")) for b in range(256)]


def merge(word: str, vocab: Dict[str, int], ranks: Dict[Tuple[str, str], int], ignore_merges: bool,
          byte_tok: Sequence[Optional[int]]) -> Tuple[int, ...]:
    """The ids of one word: merged by rank (lowest first, leftmost on ties); with ``ignore_merges`` a
    word that is a token is emitted whole."""
    mapped = word.encode("utf-8").decode("latin-1").translate(_LATIN1_TO_BYTECHAR)
    if ignore_merges:
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
            bid = byte_tok[b]
            if bid is not None:
                ids.append(bid)
    return tuple(ids)
