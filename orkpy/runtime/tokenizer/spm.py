"""llama.cpp's SPM tokenizer (``tokenizer.ggml.model = "llama"``): greedy merges by score, bytes as the
``<0xXX>`` tokens, and the cut points that let a fragment be tokenized in independent pieces (see
orkpy.runtime.tokenizer's docstring)."""
from __future__ import annotations

import heapq
import re
from typing import Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

from ._tables import _SPACE


def glue_chars(tokens: Sequence[str]) -> FrozenSet[str]:
    """The characters c such that some token contains c + "\u2581": a cut in front of a "\u2581"
    preceded by any other character can never be crossed by a merge."""
    glue: Set[str] = set()
    for t in tokens:
        k = t.find(_SPACE, 1)
        while k != -1:
            glue.add(t[k - 1])
            k = t.find(_SPACE, k + 1)
    return frozenset(glue)


def splitter(glue: FrozenSet[str]) -> re.Pattern[str]:
    """The expression that cuts a fragment in front of every "\u2581" not preceded by a ``glue`` character."""
    if glue:
        cls = "".join(re.escape(c) for c in sorted(glue))
        return re.compile(f"(?<![{cls}])(?={_SPACE})")
    return re.compile(f"(?={_SPACE})")


def byte_ids(vocab: Dict[str, int]) -> List[Optional[int]]:
    """The id of each byte's ``<0xXX>`` token (llama.cpp falls back to the byte itself as a token)."""
    out: List[Optional[int]] = []
    for b in range(256):
        i = vocab.get(f"<0x{b:02X}>")
        if i is None:   # llama.cpp falls back to the byte itself as a token
            i = vocab.get(bytes([b]).decode("utf-8", "surrogateescape"))
        out.append(i)
    return out


def merge(piece: str, vocab: Dict[str, int], scores: Sequence[float], byte_tokens: Sequence[Optional[int]],
          unk_id: Optional[int]) -> Tuple[int, ...]:
    """The ids of one piece: adjacent symbols merged greedily, always the pair whose concatenation is
    a vocabulary token of the highest score, the leftmost one on ties; a final symbol that is not a
    token as its UTF-8 bytes."""
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
            bid = byte_tokens[b]
            if bid is None:
                if unk_id is None:
                    raise ValueError(f"character {s!r} is not in the vocabulary and byte 0x{b:02X} "
                                     "has no <0xXX> token")
                bid = unk_id
            ids.append(bid)
    return tuple(ids)
