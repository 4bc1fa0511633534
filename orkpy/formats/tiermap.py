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
- llama.cpp's fallback types (``fallback=``, default ``"infer"``): llama-quantize
  stores a tensor whose rows (K) are not a multiple of 256 on a 32-block
  substitute of its K-quant / IQ type (:data:`FALLBACK`, read from the llama.cpp
  vendored by llama-cpp-python 0.3.36; :data:`FALLBACK_OLD` for older builds),
  with *more* bits: a Q4_K_M file of SmolLM2 (rows of 576) stores Q4_K as Q5_0.
  The rule then reads the *intended* type (:func:`intended_type`: the fallback
  table read backwards, the file type ``general.file_type`` and the mix rules
  that decide between candidates) -- Q5_0 from Q4_K is int4. ``"literal"`` reads
  the stored types (and warns when more than a few tensors change tier so). A
  float substitute (rows not a multiple of 32) keeps the int8 tier. Every entry
  records both types (``TierEntry.intended``; emit-map version 3).

The emit-map file (``TierMap.save`` / ``TierMap.load``) is plain UTF-8 text::

    # orkpy tier map v2
    # source: qwen3-skel-tied-Q4_K_M.gguf
    # threshold: 5.0
    # tied: true
    # name<TAB>tier<TAB>ggml_type<TAB>shape
    blk.0.attn_q.weight<TAB>int4<TAB>Q4_K<TAB>256x256

A map with any fallback entry is written as version 3: the same lines plus a
fifth column, the intended type (``-`` when it is the stored one), and a
``# types: intended|stored`` header (what the tiers were read from); maps without
fallbacks are still written as version 2, byte for byte.

``#`` lines are comments except the ``key: value`` header lines shown (each at
most once); ``shape`` is NumPy order, ASCII decimals without sign or leading
zero joined by ``x``; tiers are ``int8``, ``int4``, ``float`` (``int8``/``int4``
only for 2-D shapes), and ``int8-g<G>`` / ``int4-g<G>`` for the same tiers with
group-wise scales, one per ``G`` inputs (G a multiple of 32 in [32, 4096];
csrc/ork/pack.h; the NPU's int4-mode tiers ``w4a4-g<G>`` / ``w4a8-g<G>`` up to
480, its int4 K tile); the threshold is a finite number in (0, 64). The ggml type
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
import warnings
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from .._core import FormatError
from .._io import atomic_write
from .._typing import StrPath
from .gguf import GGML_TYPES, GGUFFile, ggml_type_info
from ..kernels.quant import KIND_INFO

_GGML_NAMES = frozenset(v["name"] for v in GGML_TYPES.values())



def _npu_int4(info: Any) -> bool:
    """Whether the NPU multiplies a kind's codes in its int4 x int4 mode: integer codes stored in 4 bits
    (``w4a4``, ``w4a8``; a 4-bit codebook is inflated to int8 instead)."""
    return info.levels is None and info.store_bits == 4


def _tier_of(info: Any) -> str:
    """The tier a kind row runs: ``int<store_bits>``, or the kind's own name for a kind the NPU runs in its
    int4 mode (``w4a4``: 4-bit activations; ``w4a8``: int8 activations as two int4 digits)."""
    return info.name if _npu_int4(info) else f"int{info.store_bits}"


def _integer_tiers() -> Dict[str, Optional[str]]:
    """{integer tier: the kind that runs it}, widest first, from the kind registry (the one place tiers
    are made): a kind stored in b bits per code (``store_bits``) runs the tier ``int<b>``; a kind with
    integer codes (int8, int6, int5) has its tier to itself, and the 4-bit codebooks (nf4, int4, ...)
    share ``int4``, whose kind each call chooses (None here; ``int4_kind=`` / ``kind=``). A kind with
    NPU runs in its int4 mode (``w4a8``, ``w4a4``) runs the tier named after it, last."""
    out: Dict[str, Optional[str]] = {}
    for k, info in sorted(KIND_INFO.items(), key=lambda kv: (_npu_int4(kv[1]), -kv[1].store_bits, -kv[1].act_bits)):
        tier = _tier_of(info)
        codebook = info.levels is not None
        if tier in out and (not codebook or out[tier] is not None):
            raise RuntimeError(f"kind {k!r} stores {info.store_bits}-bit codes like another kind: the tier {tier} "
                               "is run by one integer kind or by codebooks only")
        out[tier] = None if codebook else k
    return out


#: integer tier -> the kind that runs it (None: the 4-bit codebook tier, its kind chosen per call)
TIER_KINDS: Dict[str, Optional[str]] = _integer_tiers()
#: The integer tiers, widest first ("int8", "int6", "int5", "int4"), then the NPU's int4-mode tiers "w4a8"
#: and "w4a4" (docs/w4a4.md), derived from the kind registry.
INT_TIERS: Tuple[str, ...] = tuple(TIER_KINDS)
#: The base tiers; the integer ones may carry a group size: "int4-g32", "w4a8-g128" (w4a4 / w4a8 up to
#: NPU_INT4_MAX_GROUP).
TIERS: Tuple[str, ...] = INT_TIERS + ("float",)
#: Bits per stored code of each integer tier (int6 / int5: uniform 6 / 5-bit codes, int8 computed): the
#: kind registry's ``store_bits`` of the kinds that run it.
TIER_BITS: Dict[str, int] = {t: (KIND_INFO[k].store_bits if k else 4) for t, k in TIER_KINDS.items()}
#: Activation bits of each integer tier (8; 4 for w4a4): what its linears' inputs are quantized to.
TIER_ACT_BITS: Dict[str, int] = {t: (KIND_INFO[k].act_bits if k else 8) for t, k in TIER_KINDS.items()}
#: The tiers the NPU runs in its int4 x int4 mode ("w4a8", "w4a4"); with a group size at most
#: NPU_INT4_MAX_GROUP ("w4a8-g32": each group one int4 K tile whose int16 block the host scales).
NPU_INT4_TIERS: Tuple[str, ...] = tuple(t for t, k in TIER_KINDS.items() if k and _npu_int4(KIND_INFO[k]))
#: Bits per weight the NPU reads per token for each tier: int4 codebooks, int5 and int6 are inflated to
#: int8 in NPU memory (8); w4a4's and w4a8's codes are 4 bits there (the int4 mode). ``float``: 0 (host).
NPU_BITS: Dict[str, int] = {**{t: (4 if t in NPU_INT4_TIERS else 8) for t in INT_TIERS}, "float": 0}
#: The largest group of an int4-mode tier: the int4 mode's K tile (csrc/ork/npu/plan.h ORK_NPU_INT4_MAX_KT),
#: so that a group's partial sum is one task's int16 block.
NPU_INT4_MAX_GROUP = 480
_GROUPED = re.compile(f"({'|'.join(INT_TIERS)})-g([1-9][0-9]{{1,3}})")
#: The tiers ``embeddings=`` / ``output=`` (and ``orkpy tier-map --embeddings / --output-tier``) take.
OVERRIDES = ("by_type", "int8", "int4", "float")


def tier_kind(tier: str, int4_kind: str = "nf4") -> Optional[str]:
    """The kind that runs a tier (grouped or not): its integer kind, ``int4_kind`` for the 4-bit codebook
    tier, None for ``float``. ValueError for an unknown tier."""
    base = split_tier(tier)[0]
    return None if base == "float" else TIER_KINDS[base] or int4_kind


def kind_tier(kind: str) -> str:
    """The integer tier a kind runs (``int<store_bits>``: nf4 -> int4, int6 -> int6; w4a4 -> w4a4)."""
    return _tier_of(KIND_INFO[kind])
FLOAT_TYPES = frozenset({"F32", "F16", "BF16"})  # ggml types that hold float values
EMBEDDING = "token_embd.weight"
OUTPUT = "output.weight"
_MAGIC = "# orkpy tier map v2"
_MAGIC_V3 = "# orkpy tier map v3"  # v2 + a fifth column: the intended type of a tensor stored on a fallback type
_MAGIC_V1 = "# orkpy tier map v1"
_HEADERS = ("source", "threshold", "tied", "types")
_TYPES = ("intended", "stored")  # v3 "types" header: what the tiers were read from
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
    limit = 4096 if m is None or m.group(1) not in NPU_INT4_TIERS else NPU_INT4_MAX_GROUP
    if m is None or int(m.group(2)) % 32 or int(m.group(2)) > limit:
        raise ValueError(f"unknown tier {tier!r} (expected {', '.join(TIERS)}, or an integer tier with a group size: "
                         f"'int4-g32', a multiple of 32 up to 4096; up to {NPU_INT4_MAX_GROUP} for "
                         f"{' / '.join(NPU_INT4_TIERS)}, the int4 mode's K tile)")
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
    if e.intended is not None and (not isinstance(e.intended, str) or e.intended not in _GGML_NAMES):
        return f"unknown intended ggml type {e.intended!r}"
    shape = e.shape
    if (not isinstance(shape, tuple) or not 1 <= len(shape) <= 4
            or not all(type(d) is int and 1 <= d <= _DIM_MAX for d in shape) or math.prod(shape) > _DIM_MAX):
        return f"bad shape {shape!r} (1 to 4 positive int dimensions, at most 2^63-1 elements)"
    if split_tier(e.tier)[0] != "float" and len(shape) != 2:
        return f"tier {e.tier!r} needs a 2-D weight, the shape is {'x'.join(map(str, shape))}"
    return None


@dataclass(frozen=True)
class TierEntry:
    """One tensor's tier, its ggml type as stored in the allocation file, its shape (NumPy order) and,
    when llama-quantize stored it on a fallback type, the type it intended (:func:`intended_type`;
    None: the stored type is the intended one)."""
    tier: str
    ggml_type: str
    shape: Tuple[int, ...]
    intended: Optional[str] = None

    @property
    def intended_type(self) -> str:
        """The type llama.cpp's mix chose for this tensor (the stored type unless a fallback replaced it)."""
        return self.intended or self.ggml_type

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
    """Storage bytes of an (N, K) weight packed for the NPU (``PackedWeight.nbytes``, the file's):
    codes in 32 x 32 tiles (N and K padded to multiples of 32; 1 byte per int8
    code, 2 int4/nf4 codes per byte, 6 / 5 bits per int6 / int5 code) + one float32 scale
    per row (4 bytes), or for a
    grouped tier one float16 scale (2 bytes) per group of inputs (``ceil(K / G)`` per
    row when ``G < K``; docs/o4n1.md version 3)."""
    base, g = split_tier(tier)
    Np, Kp = -(-N // 32) * 32, -(-K // 32) * 32
    codes = Np * Kp * TIER_BITS[base] // 8
    return codes + (2 * N * -(-K // g) if g and g < K else 4 * N)


class TierMap:
    """name -> :class:`TierEntry`, plus the settings it was made with."""

    def __init__(self, entries: Dict[str, TierEntry], threshold: float = 5.0, source: Optional[str] = None,
                 tied: Optional[bool] = None, types: str = "intended") -> None:
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
        if types not in _TYPES:
            raise ValueError(f"types must be one of {', '.join(_TYPES)}, got {types!r}")
        self.types = types  # "intended": tiers from the intended types; "stored": fallback="literal"

    def fallbacks(self) -> Dict[str, TierEntry]:
        """{name: entry} of the tensors the allocation file stores on a llama.cpp fallback type."""
        return {n: e for n, e in self.entries.items() if e.intended is not None}

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
        out = {t: 0 for t in TIER_BITS}
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
        total = sum(b.values())
        return b["int8"] / total if total else 0.0

    # emit-map file
    def save(self, path: StrPath) -> None:
        """Write the emit-map text atomically (temp file + fsync + rename); names are
        escaped (module docstring) so that :meth:`load` gives every name back."""
        v3 = any(e.intended is not None for e in self.entries.values())  # else v2, byte for byte as before
        lines = [_MAGIC_V3 if v3 else _MAGIC]
        if self.source:
            lines.append(f"# source: {_escape(self.source, edges=True)}")
        lines.append(f"# threshold: {self.threshold!r}")
        lines.append(f"# tied: {'true' if self.tied else 'false'}")
        if v3:
            lines.append(f"# types: {self.types}")
            lines.append("# name\ttier\tggml_type\tshape\tintended (the type llama.cpp intended before its fallback; "
                         "- = as stored)")
        else:
            lines.append("# name\ttier\tggml_type\tshape")
        for n, e in self.entries.items():
            row = f"{_escape(n)}\t{e.tier}\t{e.ggml_type}\t{'x'.join(str(d) for d in e.shape)}"
            lines.append(row + (f"\t{e.intended or '-'}" if v3 else ""))
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
        if not lines or lines[0].strip() not in (_MAGIC_V3, _MAGIC, _MAGIC_V1):
            raise FormatError(f"{path}:1: not an orkpy tier map (first line must be {_MAGIC_V3!r}, {_MAGIC!r} or "
                              f"{_MAGIC_V1!r})")
        unescape = _unescape if lines[0].strip() != _MAGIC_V1 else (lambda s: s)
        nfields = 5 if lines[0].strip() == _MAGIC_V3 else 4
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
            if len(parts) != nfields:
                raise FormatError(f"{path}:{i}: expected {nfields} tab-separated fields, got {len(parts)}")
            name_s, tier, gtype, shape_s = parts[:4]
            intended = parts[4] if nfields == 5 and parts[4] != "-" else None
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
                entry = TierEntry(tier, gtype, tuple(int(d) for d in shape_s.split("x")), intended)
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
        types = header.get("types", (0, "intended"))
        if types[1] not in _TYPES:
            raise FormatError(f"{path}:{types[0]}: bad 'types' value {types[1]!r} (one of {', '.join(_TYPES)})")
        return cls(entries, threshold=threshold, source=source, tied=None if tied[1] is None else tied[1] == "true",
                   types=types[1])

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
                and self.threshold == other.threshold and self.tied == other.tied and self.types == other.types)

    def __repr__(self) -> str:
        c = self.counts_by_tier()
        return (f"TierMap({len(self)} tensors: int8 {c['int8']}, int4 {c['int4']}, float {c['float']}; "
                f"int8 share {self.int8_share():.1%})")


def _atomic_write_text(path: StrPath, text: str) -> None:
    atomic_write(path, [text.encode("utf-8")])


# ------------------------------------------------------ llama.cpp fallbacks --
#: llama-quantize's ``tensor_type_fallback`` (src/llama-quant.cpp of the llama.cpp vendored by
#: llama-cpp-python 0.3.36): when a tensor's row length (ncols, K in NumPy order) is not a
#: multiple of the intended type's block of 256, the tensor is stored as this 32-block type
#: instead, and as F16 when even that block does not divide the row.
FALLBACK = {"IQ1_S": "IQ4_NL", "IQ1_M": "IQ4_NL", "IQ2_XXS": "IQ4_NL", "IQ2_XS": "IQ4_NL", "IQ2_S": "IQ4_NL",
            "IQ3_XXS": "IQ4_NL", "IQ3_S": "IQ4_NL", "IQ4_XS": "IQ4_NL", "Q2_K": "Q4_0", "Q3_K": "Q4_0",
            "TQ1_0": "Q4_0", "TQ2_0": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
#: the mapping of older llama.cpp builds where it differs: Q2_K / Q3_K fell back to IQ4_NL
FALLBACK_OLD = {"Q2_K": "IQ4_NL", "Q3_K": "IQ4_NL"}
#: ``general.file_type`` (llama.h ``llama_ftype``) -> (name, the type its mix starts every tensor from:
#: ``llama_ftype_get_default_type``)
FILE_TYPES = {0: ("ALL_F32", "F32"), 1: ("MOSTLY_F16", "F16"), 2: ("MOSTLY_Q4_0", "Q4_0"), 3: ("MOSTLY_Q4_1", "Q4_1"),
              7: ("MOSTLY_Q8_0", "Q8_0"), 8: ("MOSTLY_Q5_0", "Q5_0"), 9: ("MOSTLY_Q5_1", "Q5_1"),
              10: ("MOSTLY_Q2_K", "Q2_K"), 11: ("MOSTLY_Q3_K_S", "Q3_K"), 12: ("MOSTLY_Q3_K_M", "Q3_K"),
              13: ("MOSTLY_Q3_K_L", "Q3_K"), 14: ("MOSTLY_Q4_K_S", "Q4_K"), 15: ("MOSTLY_Q4_K_M", "Q4_K"),
              16: ("MOSTLY_Q5_K_S", "Q5_K"), 17: ("MOSTLY_Q5_K_M", "Q5_K"), 18: ("MOSTLY_Q6_K", "Q6_K"),
              19: ("MOSTLY_IQ2_XXS", "IQ2_XXS"), 20: ("MOSTLY_IQ2_XS", "IQ2_XS"), 21: ("MOSTLY_Q2_K_S", "Q2_K"),
              22: ("MOSTLY_IQ3_XS", "IQ3_S"), 23: ("MOSTLY_IQ3_XXS", "IQ3_XXS"), 24: ("MOSTLY_IQ1_S", "IQ1_S"),
              25: ("MOSTLY_IQ4_NL", "IQ4_NL"), 26: ("MOSTLY_IQ3_S", "IQ3_S"), 27: ("MOSTLY_IQ3_M", "IQ3_S"),
              28: ("MOSTLY_IQ2_S", "IQ2_XS"), 29: ("MOSTLY_IQ2_M", "IQ2_S"), 30: ("MOSTLY_IQ4_XS", "IQ4_XS"),
              31: ("MOSTLY_IQ1_M", "IQ1_M"), 32: ("MOSTLY_BF16", "BF16"), 36: ("MOSTLY_TQ1_0", "TQ1_0"),
              37: ("MOSTLY_TQ2_0", "TQ2_0")}
FALLBACK_MODES = ("infer", "literal")


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's Q4_K_M / Q5_K_M rule for the attn_v / ffn_down of block i of n (integer division)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _mix_type(name: str, default: str, file_type: int, n_layer: int, tied: bool, K: int) -> str:
    """The type llama.cpp's mix gives tensor ``name`` (rows of ``K``) before any fallback, for the
    rules that decide a tier: the head (and a tied embedding table) Q8_0 when the default type's
    block does not divide its rows, else Q6_K; attn_v / ffn_down Q6_K in the blocks
    ``use_more_bits`` picks for Q4_K_M / Q5_K_M; otherwise the file type's default type."""
    if name == OUTPUT or (tied and name == EMBEDDING):
        if default == "Q8_0" or K % ggml_type_info(default)["block_size"] != 0:
            return "Q8_0"
        return "Q6_K"
    m = re.fullmatch(r"blk\.(\d+)\.(attn_v|ffn_down)\.weight", name)
    if m and file_type in (15, 17) and n_layer > 0 and use_more_bits(int(m.group(1)), n_layer):
        return "Q6_K"
    return default


def intended_type(name: str, stored: str, shape: Sequence[int], file_type: Optional[int], n_layer: int = 0,
                  tied: bool = False) -> Tuple[Optional[str], str]:
    """(intended type or None, why) of a 2-D tensor that llama-quantize wrote as ``stored``:
    None when ``stored`` is what it intended. The intended type is inferred from the row length
    ``K = shape[-1]``, :data:`FALLBACK` (and :data:`FALLBACK_OLD`) read backwards and the file
    type (:data:`FILE_TYPES`): a fallback happens only when ``K`` is not a multiple of 256 (of 32
    for F16), and a 32-block type is taken as chosen directly when the file's mix chooses it (its
    default type, the head's Q8_0 for rows its default block does not divide, Q5_1 for a Q5_0
    file's ffn_down)."""
    K = int(shape[-1])
    if file_type is None or file_type not in FILE_TYPES:
        return None, "no known general.file_type: the stored type is taken as intended"
    ftname, default = FILE_TYPES[file_type]
    if default in FLOAT_TYPES:
        return None, f"{ftname}: a float file"
    head = name == OUTPUT or (tied and name == EMBEDDING)
    if stored in FLOAT_TYPES:
        if K % 32 == 0:
            return None, "stored float although its rows fit 32-blocks: llama.cpp kept it float"
        want = _mix_type(name, default, file_type, n_layer, tied, K)
        return want, f"rows of {K} are not a multiple of 32: llama.cpp fell back to {stored} from {want}"
    if K % 256 == 0:
        return None, "rows fit 256-blocks: no fallback"
    sources = [t for t, f in FALLBACK.items() if f == stored] + [t for t, f in FALLBACK_OLD.items() if f == stored]
    if not sources:
        return None, f"{stored} is no fallback type"
    direct = stored == default or (stored == "Q5_1" and default == "Q5_0" and name.endswith("ffn_down.weight"))
    if head and stored == "Q8_0" and K % ggml_type_info(default)["block_size"] != 0:
        direct = True  # llama.cpp's own rule for a head whose rows its default block does not divide
    if direct:
        return None, f"{stored} is this {ftname} file's own choice"
    want = _mix_type(name, default, file_type, n_layer, tied, K)
    if want not in sources:  # the mix's choice does not fall back to the stored type: the nearest source
        want = default if default in sources else sources[0]
    return want, f"rows of {K} are not a multiple of 256: llama.cpp fell back from {want} to {stored}"


def type_tier(ggml_type: str, threshold: float = 5.0) -> str:
    """The tier the rule gives a 2-D weight of this ggml type."""
    info = ggml_type_info(ggml_type)
    if info["name"] in FLOAT_TYPES:
        return "int8"
    return "int8" if info["bits_per_weight"] >= threshold else "int4"


def tier_map(gguf: Union[GGUFFile, StrPath], threshold: float = 5.0, embeddings: str = "by_type",
             output: str = "by_type", fallback: str = "infer") -> TierMap:
    """Tier per tensor from a (mixed) GGUF's types. See the module docstring. ``fallback``:
    ``"infer"`` (default) tiers a tensor that llama-quantize stored on a fallback type by the type
    it intended (:func:`intended_type`; e.g. a Q4_K_M file's Q5_0 on rows of 576 is an intended
    Q4_K, so int4); ``"literal"`` by the stored type (a warning when more than a few tensors are on
    fallback types). A tensor llama.cpp had to store as F16 (rows not a multiple of 32) keeps the
    int8 tier either way: that file spends 16 bits on it. Each entry records the intended type
    (``TierEntry.intended``)."""
    if embeddings not in OVERRIDES or output not in OVERRIDES:
        raise ValueError(f"embeddings/output must be one of {', '.join(OVERRIDES)}")
    if fallback not in FALLBACK_MODES:
        raise ValueError(f"fallback must be one of {', '.join(FALLBACK_MODES)}, got {fallback!r}")
    try:
        threshold = float(threshold)
    except (TypeError, ValueError):
        raise ValueError(f"threshold must be a number, got {threshold!r}") from None
    if not (0.0 < threshold < 64.0):
        raise ValueError(f"threshold must be in (0, 64) bits per weight, got {threshold}")
    own = not isinstance(gguf, GGUFFile)
    g = gguf if isinstance(gguf, GGUFFile) else GGUFFile(gguf)
    try:
        ft = g.metadata.get("general.file_type")
        ft = int(ft) if isinstance(ft, int) and not isinstance(ft, bool) else None
        arch = g.metadata.get("general.architecture")
        n_layer = g.metadata.get(f"{arch}.block_count", 0) if isinstance(arch, str) else 0
        n_layer = int(n_layer) if isinstance(n_layer, int) else 0
        names = {t.name for t in g.tensors}
        tied = EMBEDDING in names and OUTPUT not in names
        entries = {}
        for t in g.tensors:
            intended = None
            if len(t.shape) == 1:
                tier = "float"
            elif len(t.shape) == 2:
                intended = intended_type(t.name, t.type, t.shape, ft, n_layer, tied)[0]
                # a float substitute (rows not a multiple of 32) keeps its tier: llama.cpp's file spends 16 bits
                # on it, so int8 stays within that file's bytes (its intended type is still recorded)
                by = intended if (intended and fallback == "infer" and t.type not in FLOAT_TYPES) else t.type
                tier = type_tier(by, threshold)
                choice = embeddings if t.name == EMBEDDING else output if t.name == OUTPUT else "by_type"
                if choice != "by_type":
                    tier = choice
            else:
                tier = "float"  # no 3-D/4-D weights in the supported architectures
            entries[t.name] = TierEntry(tier, t.type, t.shape, intended)
        tm = TierMap(entries, threshold=threshold, source=os.path.basename(g.path),
                     types="intended" if fallback == "infer" else "stored")
        fb = tm.fallbacks()
        changed = [n for n, e in fb.items() if e.ggml_type not in FLOAT_TYPES
                   and type_tier(e.intended_type, threshold) != type_tier(e.ggml_type, threshold)]
        if fallback == "literal" and len(changed) > 3:
            rows = sorted({e.shape[-1] for e in fb.values()})
            warnings.warn(f"{os.path.basename(g.path)}: {len(fb)} of {len(entries)} tensors are stored on llama.cpp "
                          f"fallback types (rows of {', '.join(map(str, rows))} are not multiples of 256); read "
                          f"literally, {len(changed)} of them get the int8 tier where llama.cpp intended fewer "
                          "bits (fallback='infer' tiers them by the intended types)", stacklevel=2)
        return tm
    finally:
        if own:
            g.close()
