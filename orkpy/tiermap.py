"""The tier map: which weight gets the int8 tier and which the int4 tier.

A llama.cpp mixed GGUF (e.g. Q4_K_M) is used as an *allocation oracle only*:
its per-tensor types decide the tiers; its quantized bytes are never used.

Rule (``tier_map(gguf, threshold=5.0)``):

- a 2-D weight whose ggml type has ``bits_per_weight >= threshold`` gets tier
  ``int8``, otherwise ``int4``. F32/F16/BF16 count as ``int8``. At the default
  threshold Q4_1 (exactly 5.0 bpw) is int8; Q4_0/Q4_K/IQ4_* are int4;
  Q5_*/Q6_K/Q8_0 are int8.
- 1-D tensors (norms, biases) stay ``float``.
- ``token_embd.weight`` (the embedding table) follows ``embeddings=``:
  ``"by_type"`` (default: the rule above, as llama.cpp's allocation chose),
  ``"int8"``, ``"int4"`` or ``"float"`` (keep it out of the integer tiers).
- ``output.weight`` (the LM head) follows ``output=`` with the same choices.
  A tied model has no ``output.weight``: its head *is* ``token_embd.weight``,
  so ``embeddings=`` decides for both and ``TierMap.tied`` is True.

The emit-map file (``TierMap.save`` / ``TierMap.load``) is plain UTF-8 text::

    # orkpy tier map v2
    # source: qwen3-skel-tied-Q4_K_M.gguf
    # threshold: 5.0
    # tied: true
    # name<TAB>tier<TAB>ggml_type<TAB>shape
    blk.0.attn_q.weight<TAB>int4<TAB>Q4_K<TAB>256x256

``#`` lines are comments except the ``key: value`` header lines shown (each at
most once); ``shape`` is NumPy order, ASCII decimals without sign or leading
zero joined by ``x``; tiers are ``int8``, ``int4``, ``float`` (``int8``/``int4``
only for 2-D shapes), and ``int8-g<G>`` / ``int4-g<G>`` for the same tiers with
group-wise scales, one per ``G`` inputs (G a multiple of 32 in [32, 4096];
csrc/ork/pack.h); the threshold is a finite number in (0, 64). The ggml type
records where the tier came from; it need not agree with the tier rule
(``embeddings=``/``output=`` and hand edits override tiers).

Names (and the source) are percent-escaped so that save -> load is the identity
for every name the GGUF reader returns (any bytes; undecodable bytes arrive as
surrogate escapes U+DC80..U+DCFF): ``%``, control characters (C0, DEL, C1), the
line separators U+2028/U+2029, a leading ``#``, and each undecodable byte are
written as ``%XX`` of their bytes (UTF-8 for characters); a source also escapes
whitespace at its ends. Loading turns ``%XX`` back into bytes and decodes the
name as UTF-8 with surrogate escapes. Version 1 files (no escapes: names are
taken literally) still load; ``save`` writes version 2.
"""
from __future__ import annotations

import collections
import math
import os
import re
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

from ._core import FormatError
from ._io import atomic_write
from ._typing import StrPath
from .gguf import GGML_TYPES, GGUFFile, ggml_type_info

_GGML_NAMES = frozenset(v["name"] for v in GGML_TYPES.values())

TIERS = ("int8", "int4", "float")  # the base tiers; int8/int4 may carry a group size: "int4-g32"
_GROUPED = re.compile(r"(int8|int4)-g([1-9][0-9]{1,3})")
_CHOICES = ("by_type", "int8", "int4", "float")
FLOAT_TYPES = frozenset({"F32", "F16", "BF16"})  # ggml types that hold float values
EMBEDDING = "token_embd.weight"
OUTPUT = "output.weight"
_MAGIC = "# orkpy tier map v2"
_MAGIC_V1 = "# orkpy tier map v1"
_HEADERS = ("source", "threshold", "tied")
_SHAPE = re.compile(r"[1-9][0-9]*(?:x[1-9][0-9]*){0,3}")                 # ASCII digits only
_NUMBER = re.compile(r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")   # what repr(float) writes
_DIM_MAX = (1 << 63) - 1


def _escape(s: str, edges: bool = False) -> str:
    """Percent-escape a name (or with ``edges`` the source) for one line of the file."""
    out = []
    last = len(s) - 1
    for i, c in enumerate(s):
        o = ord(c)
        if 0xDC80 <= o <= 0xDCFF:          # an undecodable byte (surrogateescape)
            out.append(f"%{o - 0xDC00:02X}")
        elif (c == "%" or o < 0x20 or 0x7F <= o <= 0x9F or c in "\u2028\u2029" or (i == 0 and c == "#")
              or (edges and (i == 0 or i == last) and c.isspace())):
            out.append("".join(f"%{b:02X}" for b in c.encode("utf-8")))
        else:
            out.append(c)
    return "".join(out)


def _unescape(s: str) -> str:
    """The inverse of :func:`_escape`; ValueError for a ``%`` not followed by two hex digits."""
    if "%" not in s:
        return s
    b = bytearray()
    i = 0
    while i < len(s):
        c = s[i]
        if c == "%":
            h = s[i + 1:i + 3]
            if len(h) != 2 or not all(x in "0123456789abcdefABCDEF" for x in h):
                raise ValueError(f"bad escape {s[i:i + 3]!r} (expected %XX, two hex digits)")
            b.append(int(h, 16))
            i += 3
        else:
            b += c.encode("utf-8")
            i += 1
    return b.decode("utf-8", "surrogateescape")


def _name_problem(name: object) -> Optional[str]:
    if not isinstance(name, str) or not name:
        return f"tensor name {name!r} must be a non-empty str"
    try:
        if name.encode("utf-8", "surrogateescape").decode("utf-8", "surrogateescape") == name:
            return None
    except UnicodeEncodeError:
        pass
    return f"tensor name {name!r} is not the decoding of any bytes (lone surrogates), so it cannot be stored"


def split_tier(tier: str) -> Tuple[str, int]:
    """(base tier, group size) of a tier: ``"int4-g32"`` -> ``("int4", 32)``, ``"int8"`` ->
    ``("int8", 0)``; ValueError for anything else."""
    if tier in TIERS:
        return tier, 0
    m = _GROUPED.fullmatch(tier) if isinstance(tier, str) else None
    if m is None or int(m.group(2)) % 32 or int(m.group(2)) > 4096:
        raise ValueError(f"unknown tier {tier!r} (expected {', '.join(TIERS)}, or int8/int4 with a group size: "
                         "'int4-g32', a multiple of 32 up to 4096)")
    return m.group(1), int(m.group(2))


def grouped_tier(base: str, group: int) -> str:
    """The tier string of a base tier with a group size (0: the base tier itself)."""
    return f"{base}-g{group}" if group else base


def _entry_problem(e: TierEntry) -> Optional[str]:
    """What is wrong with an entry (None if nothing): one rule for the constructor and the loader."""
    try:
        split_tier(e.tier)
    except ValueError as err:
        return str(err)
    if not isinstance(e.ggml_type, str) or e.ggml_type not in _GGML_NAMES:
        return f"unknown ggml type {e.ggml_type!r}"
    shape = e.shape
    if (not isinstance(shape, tuple) or not 1 <= len(shape) <= 4
            or not all(type(d) is int and 1 <= d <= _DIM_MAX for d in shape) or math.prod(shape) > _DIM_MAX):
        return f"bad shape {shape!r} (1 to 4 positive int dimensions, at most 2^63-1 elements)"
    if split_tier(e.tier)[0] != "float" and len(shape) != 2:
        return f"tier {e.tier!r} needs a 2-D weight, the shape is {'x'.join(map(str, shape))}"
    return None


@dataclass(frozen=True)
class TierEntry:
    tier: str
    ggml_type: str
    shape: Tuple[int, ...]

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def result_bytes(self) -> int:
        """Bytes of the packed int8/int4 weight as stored (:func:`packed_nbytes`); 0 for float."""
        if self.tier == "float" or len(self.shape) != 2:
            return 0
        return packed_nbytes(self.tier, *self.shape)


def packed_nbytes(tier: str, N: int, K: int) -> int:
    """Storage bytes of an (N, K) weight packed for the NPU (``PackedWeight.nbytes``):
    codes in 32 x 32 tiles (N and K padded to multiples of 32; 1 byte per int8
    code, 2 int4/nf4 codes per byte) + one float32 scale per row (4 bytes), or for a
    grouped tier one float16 scale (2 bytes) per group of inputs (``ceil(K / G)`` per
    row when ``G < K``; docs/o4n1.md version 3)."""
    base, g = split_tier(tier)
    Np, Kp = -(-N // 32) * 32, -(-K // 32) * 32
    codes = Np * Kp if base == "int8" else Np * Kp // 2
    return codes + (2 * N * -(-K // g) if g and g < K else 4 * N)


class TierMap:
    """name -> :class:`TierEntry`, plus the settings it was made with."""

    def __init__(self, entries: Dict[str, TierEntry], threshold: float = 5.0, source: Optional[str] = None,
                 tied: Optional[bool] = None) -> None:
        for name, e in entries.items():
            problem = _name_problem(name) or _entry_problem(e)
            if problem:
                raise ValueError(f"tensor {name!r}: {problem}")
        threshold = float(threshold)
        if not 0.0 < threshold < 64.0:
            raise ValueError(f"threshold must be in (0, 64) bits per weight, got {threshold}")
        self.entries = dict(entries)
        self.threshold = threshold
        self.source = source
        self.tied = (EMBEDDING in entries and OUTPUT not in entries) if tied is None else bool(tied)

    # mapping-like
    def __getitem__(self, name: str) -> str:
        return self.entries[name].tier

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def items(self) -> Iterator[Tuple[str, str]]:
        return ((n, e.tier) for n, e in self.entries.items())

    def linear_tier(self, name: str) -> str:
        """The tier of the linear layer ``name``: its entry's; the LM head ``output.weight``
        without an entry of its own (a tied model's head is the embedding table) has
        ``token_embd.weight``'s; a name with neither is ``"float"``. The one rule every entry
        point (``load_model``, ``quantize_model``) reads a tier map by."""
        key = name if name in self.entries else (EMBEDDING if name == OUTPUT else name)
        return self.entries[key].tier if key in self.entries else "float"

    def names(self, tier: str) -> List[str]:
        return [n for n, e in self.entries.items() if e.tier == tier]

    def counts_by_type(self) -> Dict[str, int]:
        return dict(collections.Counter(e.ggml_type for e in self.entries.values()))

    def counts_by_tier(self) -> Dict[str, int]:
        """Entries per base tier (a grouped tier counts as its base)."""
        c = collections.Counter(split_tier(e.tier)[0] for e in self.entries.values())
        return {t: c.get(t, 0) for t in TIERS}

    def counts_by_type_and_tier(self) -> Dict[Tuple[str, str], int]:
        return dict(collections.Counter((e.ggml_type, e.tier) for e in self.entries.values()))

    def result_bytes(self) -> Dict[str, int]:
        """Storage bytes of the packed weights per tier, over the tensors that become
        packed linears: every int8/int4 2-D entry except an untied model's embedding
        table (a lookup table that ``quantize_model`` keeps in float)."""
        out = {"int8": 0, "int4": 0}
        for n, e in self.entries.items():
            base = split_tier(e.tier)[0]
            if base in out and not (n == EMBEDDING and not self.tied):
                out[base] += e.result_bytes()
        return out

    def int8_share(self) -> float:
        """The int8 share of weight storage: int8 bytes / (int8 + int4 bytes) of the
        packed linear weights (:meth:`result_bytes`); the same definition and
        figure as ``QuantizedModel.int8_share()`` for this allocation."""
        b = self.result_bytes()
        total = b["int8"] + b["int4"]
        return b["int8"] / total if total else 0.0

    # emit-map file
    def save(self, path: StrPath) -> None:
        """Write the emit-map text atomically (temp file + fsync + rename); names are
        escaped (module docstring) so that :meth:`load` gives every name back."""
        lines = [_MAGIC]
        if self.source:
            lines.append(f"# source: {_escape(self.source, edges=True)}")
        lines.append(f"# threshold: {self.threshold!r}")
        lines.append(f"# tied: {'true' if self.tied else 'false'}")
        lines.append("# name\ttier\tggml_type\tshape")
        for n, e in self.entries.items():
            lines.append(f"{_escape(n)}\t{e.tier}\t{e.ggml_type}\t{'x'.join(str(d) for d in e.shape)}")
        _atomic_write_text(path, "\n".join(lines) + "\n")

    @classmethod
    def load(cls, path: StrPath) -> TierMap:
        """Read an emit-map file (v2, or v1 with literal names); malformed content
        raises orkpy.FormatError naming the line."""
        path = os.fspath(path)
        with open(path, "rb") as f:
            data = f.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise FormatError(f"{path}: not UTF-8 text ({e})") from None
        lines = text.splitlines()
        if not lines or lines[0].strip() not in (_MAGIC, _MAGIC_V1):
            raise FormatError(f"{path}:1: not an orkpy tier map (first line must be {_MAGIC!r} or {_MAGIC_V1!r})")
        unescape = _unescape if lines[0].strip() == _MAGIC else (lambda s: s)
        header: Dict[str, Tuple[int, str]] = {}
        entries: Dict[str, TierEntry] = {}
        for i, line in enumerate(lines[1:], start=2):
            if not line.strip():
                continue
            if line.startswith("#"):
                body = line[1:].strip()
                if ":" in body and "\t" not in body:
                    k, v = (x.strip() for x in body.split(":", 1))
                    if k in header and k in _HEADERS:
                        raise FormatError(f"{path}:{i}: second {k!r} header (the first is on line {header[k][0]})")
                    header[k] = (i, v)
                continue
            parts = line.split("\t")
            if len(parts) != 4:
                raise FormatError(f"{path}:{i}: expected 4 tab-separated fields, got {len(parts)}")
            name_s, tier, gtype, shape_s = parts
            try:
                name = unescape(name_s)
            except ValueError as err:
                raise FormatError(f"{path}:{i}: tensor name {name_s!r}: {err}") from None
            if not name:
                raise FormatError(f"{path}:{i}: empty tensor name")
            if name in entries:
                raise FormatError(f"{path}:{i}: duplicate tensor {name!r}")
            if not _SHAPE.fullmatch(shape_s):
                problem: Optional[str] = f"bad shape {shape_s!r} (ASCII decimals joined by 'x', 1 to 4 dimensions)"
            else:
                entry = TierEntry(tier, gtype, tuple(int(d) for d in shape_s.split("x")))
                problem = _entry_problem(entry)
            if problem:
                raise FormatError(f"{path}:{i}: {problem} (tensor {name!r})")
            entries[name] = entry
        threshold = 5.0
        if "threshold" in header:
            i, v = header["threshold"]
            threshold = float(v) if _NUMBER.fullmatch(v) else math.nan
            if not 0.0 < threshold < 64.0:
                raise FormatError(f"{path}:{i}: bad threshold {v!r} (a number in (0, 64) bits per weight)")
        tied = header.get("tied", (0, None))
        if tied[1] not in (None, "true", "false"):
            raise FormatError(f"{path}:{tied[0]}: bad 'tied' value {tied[1]!r}")
        source = None
        if "source" in header:
            i, v = header["source"]
            try:
                source = unescape(v)
            except ValueError as err:
                raise FormatError(f"{path}:{i}: source {v!r}: {err}") from None
        return cls(entries, threshold=threshold, source=source, tied=None if tied[1] is None else tied[1] == "true")

    def check_fits(self, shapes: Dict[str, Tuple[int, ...]], model: str, linears: Sequence[str] = (),
                   what: str = "tier map") -> None:
        """ValueError naming the first entry for a tensor the model (``shapes``: its
        tensor names and shapes) lacks or has in another shape, or the first of
        ``linears`` with no entry (``output.weight`` may use ``token_embd.weight``'s)."""
        for n, e in self.entries.items():
            if n not in shapes:
                raise ValueError(f"{what}: entry {n!r} names a tensor {model} does not have: the map is for "
                                 "another model")
            if tuple(shapes[n]) != tuple(e.shape):
                raise ValueError(f"{what}: entry {n!r} has shape {'x'.join(map(str, e.shape))}, {model} has "
                                 f"{'x'.join(map(str, shapes[n]))}: the map is for another model")
        for n in linears:
            if n not in self.entries and not (n == OUTPUT and EMBEDDING in self.entries):
                raise ValueError(f"{what} has no entry for {n!r}, a linear layer of {model}: is it for this model?")

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, TierMap) and self.entries == other.entries
                and self.threshold == other.threshold and self.tied == other.tied)

    def __repr__(self) -> str:
        c = self.counts_by_tier()
        return (f"TierMap({len(self)} tensors: int8 {c['int8']}, int4 {c['int4']}, float {c['float']}; "
                f"int8 share {self.int8_share():.1%})")


def _atomic_write_text(path: StrPath, text: str) -> None:
    atomic_write(path, [text.encode("utf-8")])


def type_tier(ggml_type: str, threshold: float = 5.0) -> str:
    """The tier the rule gives a 2-D weight of this ggml type."""
    info = ggml_type_info(ggml_type)
    if info["name"] in FLOAT_TYPES:
        return "int8"
    return "int8" if info["bits_per_weight"] >= threshold else "int4"


def tier_map(gguf: Union[GGUFFile, StrPath], threshold: float = 5.0, embeddings: str = "by_type",
             output: str = "by_type",
             ) -> TierMap:
    """Tier per tensor from a (mixed) GGUF's types. See the module docstring."""
    if embeddings not in _CHOICES or output not in _CHOICES:
        raise ValueError(f"embeddings/output must be one of {', '.join(_CHOICES)}")
    try:
        threshold = float(threshold)
    except (TypeError, ValueError):
        raise ValueError(f"threshold must be a number, got {threshold!r}") from None
    if not (0.0 < threshold < 64.0):
        raise ValueError(f"threshold must be in (0, 64) bits per weight, got {threshold}")
    own = not isinstance(gguf, GGUFFile)
    g = gguf if isinstance(gguf, GGUFFile) else GGUFFile(gguf)
    try:
        entries = {}
        for t in g.tensors:
            if len(t.shape) == 1:
                tier = "float"
            elif len(t.shape) == 2:
                tier = type_tier(t.type, threshold)
                choice = embeddings if t.name == EMBEDDING else output if t.name == OUTPUT else "by_type"
                if choice != "by_type":
                    tier = choice
            else:
                tier = "float"  # no 3-D/4-D weights in the supported architectures
            entries[t.name] = TierEntry(tier, t.type, t.shape)
        return TierMap(entries, threshold=threshold, source=os.path.basename(g.path))
    finally:
        if own:
            g.close()


