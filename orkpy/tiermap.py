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

    # orkpy tier map v1
    # source: qwen3-skel-tied-Q4_K_M.gguf
    # threshold: 5.0
    # tied: true
    # name<TAB>tier<TAB>ggml_type<TAB>shape
    blk.0.attn_q.weight<TAB>int4<TAB>Q4_K<TAB>256x256

``#`` lines are comments except the ``key: value`` header lines shown;
``shape`` is NumPy order joined by ``x``; tiers are ``int8``, ``int4``,
``float``.
"""
from __future__ import annotations

import collections
import os
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Tuple, Union

from ._core import FormatError
from ._io import atomic_write
from ._typing import StrPath
from .gguf import GGML_TYPES, GGUFFile, ggml_type_info

TIERS = ("int8", "int4", "float")
_CHOICES = ("by_type", "int8", "int4", "float")
_FLOAT_SOURCE = {"F32", "F16", "BF16"}
EMBEDDING = "token_embd.weight"
OUTPUT = "output.weight"
_MAGIC = "# orkpy tier map v1"


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
    code, 2 int4/nf4 codes per byte) + one float32 scale per row."""
    Np, Kp = -(-N // 32) * 32, -(-K // 32) * 32
    return (Np * Kp if tier == "int8" else Np * Kp // 2) + 4 * N


class TierMap:
    """name -> :class:`TierEntry`, plus the settings it was made with."""

    def __init__(self, entries: Dict[str, TierEntry], threshold: float = 5.0, source: Optional[str] = None,
                 tied: Optional[bool] = None) -> None:
        for name, e in entries.items():
            if e.tier not in TIERS:
                raise ValueError(f"tensor {name!r}: unknown tier {e.tier!r} (expected {', '.join(TIERS)})")
        self.entries = dict(entries)
        self.threshold = float(threshold)
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

    def names(self, tier: str) -> List[str]:
        return [n for n, e in self.entries.items() if e.tier == tier]

    def counts_by_type(self) -> Dict[str, int]:
        return dict(collections.Counter(e.ggml_type for e in self.entries.values()))

    def counts_by_tier(self) -> Dict[str, int]:
        c = collections.Counter(e.tier for e in self.entries.values())
        return {t: c.get(t, 0) for t in TIERS}

    def counts_by_type_and_tier(self) -> Dict[Tuple[str, str], int]:
        return dict(collections.Counter((e.ggml_type, e.tier) for e in self.entries.values()))

    def result_bytes(self) -> Dict[str, int]:
        """Storage bytes of the packed weights per tier, over the tensors that become
        packed linears: every int8/int4 2-D entry except an untied model's embedding
        table (a lookup table that ``quantize_model`` keeps in float)."""
        out = {"int8": 0, "int4": 0}
        for n, e in self.entries.items():
            if e.tier in out and not (n == EMBEDDING and not self.tied):
                out[e.tier] += e.result_bytes()
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
        """Write the emit-map text atomically (temp file + fsync + rename)."""
        lines = [_MAGIC]
        if self.source:
            lines.append(f"# source: {self.source}")
        lines.append(f"# threshold: {self.threshold!r}")
        lines.append(f"# tied: {'true' if self.tied else 'false'}")
        lines.append("# name\ttier\tggml_type\tshape")
        for n, e in self.entries.items():
            lines.append(f"{n}\t{e.tier}\t{e.ggml_type}\t{'x'.join(str(d) for d in e.shape)}")
        _atomic_write_text(path, "\n".join(lines) + "\n")

    @classmethod
    def load(cls, path: StrPath) -> TierMap:
        """Read an emit-map file; malformed content raises orkpy.FormatError naming the line."""
        path = os.fspath(path)
        with open(path, "rb") as f:
            data = f.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise FormatError(f"{path}: not UTF-8 text ({e})") from None
        lines = text.splitlines()
        if not lines or lines[0].strip() != _MAGIC:
            raise FormatError(f"{path}:1: not an orkpy tier map (first line must be {_MAGIC!r})")
        header, entries = {}, {}
        for i, line in enumerate(lines[1:], start=2):
            if not line.strip():
                continue
            if line.startswith("#"):
                body = line[1:].strip()
                if ":" in body and "\t" not in body:
                    k, v = body.split(":", 1)
                    header[k.strip()] = v.strip()
                continue
            parts = line.split("\t")
            if len(parts) != 4:
                raise FormatError(f"{path}:{i}: expected 4 tab-separated fields, got {len(parts)}")
            name, tier, gtype, shape_s = parts
            if not name:
                raise FormatError(f"{path}:{i}: empty tensor name")
            if name in entries:
                raise FormatError(f"{path}:{i}: duplicate tensor {name!r}")
            if tier not in TIERS:
                raise FormatError(f"{path}:{i}: unknown tier {tier!r} (expected {', '.join(TIERS)})")
            try:
                ggml_type_info(gtype)
            except KeyError:
                raise FormatError(f"{path}:{i}: unknown ggml type {gtype!r}") from None
            try:
                shape = tuple(int(d) for d in shape_s.split("x"))
            except ValueError:
                raise FormatError(f"{path}:{i}: bad shape {shape_s!r}") from None
            if not shape or any(d < 1 for d in shape) or len(shape) > 4:
                raise FormatError(f"{path}:{i}: bad shape {shape_s!r}")
            entries[name] = TierEntry(tier, gtype, shape)
        try:
            threshold = float(header.get("threshold", "5.0"))
        except ValueError:
            raise FormatError(f"{path}: bad threshold {header.get('threshold')!r}") from None
        tied = header.get("tied")
        if tied not in (None, "true", "false"):
            raise FormatError(f"{path}: bad 'tied' value {tied!r}")
        return cls(entries, threshold=threshold, source=header.get("source"),
                   tied=None if tied is None else tied == "true")

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
    if info["name"] in _FLOAT_SOURCE:
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


