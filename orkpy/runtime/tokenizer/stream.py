"""Streaming output: the text of a growing sequence of token ids as it becomes final, and llama.cpp's
clean-up of spaces that a decode applies."""
from __future__ import annotations

import codecs
from typing import Any, Protocol


class Pieces(Protocol):
    """What a stream reads of its tokenizer (:class:`orkpy.Tokenizer`)."""

    add_space_prefix: bool
    _clean_spaces: bool

    def _piece(self, tid: int, special: bool) -> bytes: ...

    def _check_id(self, token_id: Any, pos: int) -> int: ...

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

    def __init__(self, tok: Pieces, special: bool = False, continuation: bool = False) -> None:
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
