"""Quantization recipes: everything that decides *how* a model is quantized, as one validated,
serializable value (docs/recipes.md).

A :class:`Recipe` is a frozen tree of five sections in pipeline order --
:class:`TransformSpec` (rotation, SmoothQuant), :class:`CalibrationSpec` (the calibration chunks),
:class:`AllocationSpec` (an oracle's threshold or a target size, the int4 codebook, groups, the
tied lookup), :class:`RoundingSpec` (RTN or GPTQ, AWQ, stochastic rounding, the clip search) and
:class:`ActivationSpec` (the activation mode the model is made for, and the calibration's
prefix) -- plus a ``version``. Every value is checked when a recipe is built (``Recipe(...)``,
:meth:`Recipe.from_dict`, :meth:`Recipe.load`, :meth:`Recipe.from_kwargs`), and each error is a
:class:`RecipeError` naming the key path (``calibration.chunks``) and, for a file, its line:
nothing is read or computed before the whole recipe is valid.

Not in a recipe: the inputs (source, allocation oracle, imatrix, calibration text: arguments, in a
model directory's manifest by name and sha256) and what never changes a result (threads, progress, ...).

The text format is JSON (the manifest's, so ``Recipe.load(model_dir)`` re-reads the recipe a model
was made with); TOML too where the standard library has ``tomllib`` (3.11+; on 3.10 a clear error).
Keys left out take their defaults; :meth:`Recipe.to_dict` / :meth:`Recipe.dumps` write every key, so
two recipes that mean the same are the same text.

The command line maps onto it (``orkpy.cli.quantize``): every ``orkpy quantize`` option is a recipe
key (``CLI_KEYS``) or an input / run option (``CLI_NOT_RECIPE``); ``--recipe FILE`` runs a recipe (the
flags on top), ``orkpy recipe [flags]`` prints the recipe a command line means.
"""
from __future__ import annotations

import difflib
import json
import math
import numbers
import os
import re
import sys
from dataclasses import dataclass, field, fields
from typing import Any, Callable, ClassVar, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from .._io import json_finite_float
from .._typing import StrPath
from ..formats import modeldir, tiermap
from ..formats.tiermap import INT_TIERS, split_tier
from ..kernels.actspec import ActSpec
from ..kernels.quant import CLIP_SEARCHES, FOUR_BIT_KINDS, check_group
from ..runtime import actcal, rotate
from ..runtime.rotate import ROTATIONS
from .gptq import PRECISIONS
from .sensitivity import SENSITIVITY_METHODS

VERSION = 1
PLACEMENTS = rotate.PLACEMENTS
FALLBACKS = tiermap.FALLBACK_MODES
TIED_LOOKUPS = ("float", "packed")
METHODS = ("rtn", "gptq")
#: GPTQ's arithmetic (the registry lives with GPTQ: orkpy.quantization.gptq.PRECISIONS)
GPTQ_PRECISIONS = PRECISIONS
_MANIFEST_FORMAT = modeldir.FORMAT  # a model directory's manifest holds the recipe it was made with

Key = Tuple[str, ...]


class RecipeError(ValueError):
    """A recipe that cannot run: ``key`` the key path (``"calibration.chunks"``), ``file`` and
    ``line`` where it was read from (None when built in Python or not known)."""

    def __init__(self, key: str, message: str, file: Optional[str] = None, line: Optional[int] = None) -> None:
        self.key, self.message, self.file, self.line = key, message, file, line
        where = "" if file is None else f"{file}:{line}: " if line is not None else f"{file}: "
        super().__init__(where + message)

    def located(self, file: Optional[str], lines: Mapping[Key, int]) -> "RecipeError":
        """The same error with the file and the line of its key (or of the nearest enclosing key)."""
        parts: Key = tuple(self.key.split(".")) if self.key else ()
        while parts and parts not in lines:
            parts = parts[:-1]
        return RecipeError(self.key, self.message, file, lines.get(parts) if parts else None)


# ------------------------------------------------------------------ value checks --
# Each takes (key path, value) and returns the value as stored, or raises RecipeError naming the key.

Check = Callable[[str, Any], Any]


def _show(v: Any) -> str:
    return f"{v!r:.60} (a {type(v).__name__})" if not isinstance(v, (str, type(None))) else repr(v)


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


COUNT_MAX = 2 ** 31 - 1  #: a count of tokens or chunks (C takes them as Py_ssize_t / int; a context is < 2^31)
SEED_MAX = 2 ** 64 - 1  #: a seed: 64 bits (orkpy.quantize's stochastic rounding, the rotation's generator)
_FLT_MAX = 3.4028234663852886e38


def _int(lo: int, hi: int) -> Check:
    """An integer in [lo, hi], compared exactly (a 400-digit integer is refused, not converted)."""
    def check(key: str, v: Any) -> int:
        if not _is_int(v) or v < lo:
            raise RecipeError(key, f"{key} must be an integer >= {lo}, got {_show(v)}")
        if v > hi:
            top = "2^64" if hi == SEED_MAX else "2^31" if hi == COUNT_MAX else str(hi + 1)
            raise RecipeError(key, f"{key} must be an integer >= {lo} below {top}, got {_show(v)}")
        return int(v)
    return check


def _finite(v: Any) -> bool:
    """A real number (not a bool) that is a finite float: an integer too large for a float is not."""
    if not isinstance(v, numbers.Real) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def _real(lo: float, hi: float, lo_open: bool, hi_open: bool) -> Check:
    def check(key: str, v: Any) -> float:
        ok = _finite(v)
        if ok:
            x = float(v)
            ok = (x > lo if lo_open else x >= lo) and (x < hi if hi_open else x <= hi)
        if not ok:
            rng = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
            raise RecipeError(key, f"{key} must be a number in {rng}, got {_show(v)}")
        return float(v)
    return check


def _bool(key: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise RecipeError(key, f"{key} must be true or false, got {_show(v)}")
    return v


def _choice(options: Sequence[Any], what: str = "") -> Check:
    def check(key: str, v: Any) -> Any:
        if isinstance(v, bool) or v not in options:
            raise RecipeError(key, f"{key} must be one of {', '.join(map(repr, options))}{what}, got {_show(v)}")
        return v
    return check


def _optional(inner: Check) -> Check:
    def check(key: str, v: Any) -> Any:
        if v is None:
            return None
        try:
            return inner(key, v)
        except RecipeError as e:
            raise RecipeError(key, e.message.replace(", got", " or null (none), got", 1)) from None
    return check


def _group(key: str, v: Any) -> Optional[int]:
    if v is not None and not _is_int(v):
        raise RecipeError(key, f"{key} must be null (one scale per output channel) or a multiple of 32 in "
                               f"[32, 4096], got {_show(v)}")
    try:
        return check_group(v) or None
    except (TypeError, ValueError) as e:
        raise RecipeError(key, f"{key}: {e}") from None


def _tiers(key: str, v: Any) -> Optional[Tuple[str, ...]]:
    if v is None:
        return None
    if isinstance(v, str) or not isinstance(v, Sequence) or not v:
        raise RecipeError(key, f"{key} must be null (orkpy.quantization.alloc.DEFAULT_OPTIONS) or a non-empty list of tiers, "
                               f"got {_show(v)}")
    for t in v:
        try:
            base = split_tier(t)[0]
        except (TypeError, ValueError):
            base = "?"
        if base not in INT_TIERS:
            raise RecipeError(key, f"{key}: option {t!r} is not an integer tier ({', '.join(INT_TIERS)}, "
                                   "optionally with a group size: 'int4-g32')")
    return tuple(v)


def _grid(key: str, v: Any) -> Optional[Tuple[float, ...]]:
    if v is None:
        return None
    vals = list(v) if not isinstance(v, (str, bytes, Mapping)) and isinstance(v, Iterable) else None
    if not vals or not all(_finite(x) and 0 < float(x) <= _FLT_MAX for x in vals):   # float32 ratios
        raise RecipeError(key, f"{key} must be null (the default grid) or a non-empty list of clip ratios > 0, "
                               f"got {_show(v)}")
    return tuple(float(x) for x in vals)


def _key(default: Any, check: Check, doc: str) -> Any:
    return field(default=default, metadata={"check": check, "doc": doc})


# ------------------------------------------------------------------ sections --

class _Section:
    """A recipe section: every field checked on construction (its metadata's ``check``)."""

    NAME: ClassVar[str] = ""

    def __post_init__(self) -> None:
        for f in fields(self):  # type: ignore[arg-type]
            object.__setattr__(self, f.name, f.metadata["check"](f"{self.NAME}.{f.name}", getattr(self, f.name)))
        self._cross()

    def _cross(self) -> None:
        """Checks between this section's keys."""

    def to_dict(self) -> Dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}  # type: ignore[arg-type]

    @classmethod
    def keys(cls) -> List[str]:
        return [f.name for f in fields(cls)]  # type: ignore[arg-type]

    @classmethod
    def from_dict(cls, d: Any) -> Any:
        if not isinstance(d, Mapping):
            raise RecipeError(cls.NAME, f"{cls.NAME} must be a table (a JSON object) of "
                                        f"{', '.join(cls.keys())}, got {_show(d)}")
        _no_unknown(d, cls.keys(), cls.NAME)
        return cls(**d)


def _plain(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def _no_unknown(d: Mapping[str, Any], known: Sequence[str], where: str) -> None:
    for k in d:
        if k not in known:
            close = difflib.get_close_matches(str(k), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            path = f"{where}.{k}" if where else str(k)
            raise RecipeError(path, f"{path}: unknown key{hint}; {where or 'a recipe'} takes {', '.join(known)}")


@dataclass(frozen=True)
class TransformSpec(_Section):
    """How the float source is transformed before anything is measured or rounded
    (:func:`orkpy.runtime.model.transformed_source`)."""

    NAME: ClassVar[str] = "transform"
    rotate: Optional[str] = _key(None, _optional(_choice(ROTATIONS)), "rotation folded into the weights")
    rotate_seed: int = _key(0, _int(0, SEED_MAX), "seed of the randomized rotation")
    rotate_online: bool = _key(False, _bool, "also rotate ffn_down's input online")
    rotate_placement: Optional[str] = _key(None, _optional(_choice(PLACEMENTS)),
                                           "where the rotation lives; null: the architecture's default")
    smooth: Optional[float] = _key(None, _optional(_real(0.0, 1.0, True, False)), "SmoothQuant alpha")

    def _cross(self) -> None:
        if self.rotate_placement is not None and self.rotate is None:
            raise RecipeError("transform.rotate_placement", f"transform.rotate_placement={self.rotate_placement!r} "
                              "places a rotation: it needs transform.rotate (e.g. 'hadamard')")


@dataclass(frozen=True)
class CalibrationSpec(_Section):
    """The chunks of the calibration text every calibrating stage reads (smoothing, AWQ, GPTQ's
    Gram matrices, the activation ranges)."""

    NAME: ClassVar[str] = "calibration"
    ctx: int = _key(512, _int(1, COUNT_MAX), "tokens per calibration chunk")
    chunks: Optional[int] = _key(8, _optional(_int(1, COUNT_MAX)), "calibration chunks; null: every whole chunk")


def _npu_options(key: str, v: Any) -> Tuple[str, ...]:
    from .npu_alloc import check_options
    if not isinstance(v, (list, tuple)) or not all(isinstance(t, str) for t in v):
        raise RecipeError(key, f"{key} must be a list of tier names, got {_show(v)}")
    try:
        return check_options(v)
    except ValueError as e:
        raise RecipeError(key, f"{key}: {e}") from None


@dataclass(frozen=True)
class AllocationSpec(_Section):
    """Which tier (int8 / int4 / float, groups) each linear gets: read from an allocation oracle
    (``threshold``, ``fallback``) or chosen for a size (``target_*``); the int4 codebook, the
    default group size and the tied lookup."""

    NAME: ClassVar[str] = "allocation"
    threshold: float = _key(5.0, _real(0.0, 64.0, True, True), "bits/weight at or above which an oracle type is int8")
    fallback: str = _key("infer", _choice(FALLBACKS), "an oracle GGUF's fallback types: intended or literal")
    target_bpw: Optional[float] = _key(None, _optional(_real(0.0, 32.0, True, False)),
                                       "choose the tiers for this many bits per linear weight")
    target_options: Optional[Tuple[str, ...]] = _key(None, _tiers, "the tiers target_bpw chooses from")
    npu_bits: Optional[float] = _key(None, _optional(_real(4.0, 8.0, False, False)),
                                     "choose W4A4 / W4A8 / W8A8 for this many NPU bits per weight")
    npu_options: Tuple[str, ...] = _key(("w4a4", "w4a8", "int8"), _npu_options, "the tiers npu_bits chooses from")
    npu_per_linear: bool = _key(True, _bool, "npu_bits measures and chooses w4a8 / int8 per linear inside an input "
                                "group (false: one choice per group, fewer passes)")
    target_chunks: int = _key(2, _int(1, COUNT_MAX), "chunks of the sensitivity measurement")
    target_ctx: int = _key(256, _int(1, COUNT_MAX), "tokens per chunk of the sensitivity measurement")
    target_sensitivity: str = _key("auto", _choice(SENSITIVITY_METHODS),
                                   "how target_bpw measures the sensitivities: per linear, a few streamed passes, "
                                   "or auto (per linear up to 1 GiB of float32 weights)")
    kind: str = _key("nf4", _choice(FOUR_BIT_KINDS, " (the int4 tier's codebook)"), "the int4 tier's codebook")
    group_size: Optional[int] = _key(None, _group, "group-wise scales for tiers that name no group")
    tied_lookup: str = _key("float", _choice(TIED_LOOKUPS), "a tied model's embedding lookup")

    def _cross(self) -> None:
        if self.npu_bits is None and not self.npu_per_linear:
            raise RecipeError("allocation.npu_per_linear", "allocation.npu_per_linear=False applies to "
                              "allocation.npu_bits")
        if self.npu_bits is not None and self.target_bpw is not None:
            raise RecipeError("allocation.npu_bits", "allocation.npu_bits (NPU bytes per token) and "
                              "allocation.target_bpw (file bytes) each choose the tiers: give one")
        if self.npu_bits is not None and self.group_size:
            raise RecipeError("allocation.group_size", "allocation.npu_bits chooses w4a4 / int8 per channel (the NPU's "
                              "int4 mode returns one accumulator per output); allocation.group_size does not apply")
        if self.target_bpw is not None and self.group_size:
            raise RecipeError("allocation.group_size", "allocation.target_bpw chooses each linear's group size itself "
                              "(allocation.target_options); allocation.group_size applies to an oracle allocation")


@dataclass(frozen=True)
class RoundingSpec(_Section):
    """How each packed linear's codes and scales are chosen."""

    NAME: ClassVar[str] = "rounding"
    method: str = _key("rtn", _choice(METHODS), "round to nearest or GPTQ")
    gptq_sequential: bool = _key(False, _bool, "GPTQ's Gram matrices layer by layer on the quantized layers")
    gptq_precision: str = _key("float64", _choice(GPTQ_PRECISIONS),
                               "GPTQ's factor and error feedback in float64, or float32 (about 2x faster at K = "
                               "6144, half the memory)")
    awq: bool = _key(False, _bool, "AWQ-style input-channel scales folded in before rounding")
    sr: bool = _key(False, _bool, "stochastic rounding")
    seed: int = _key(0, _int(0, SEED_MAX), "seed of the stochastic rounding")
    clip_search: str = _key("screen", _choice(CLIP_SEARCHES), "the imatrix clip search of the 4-bit tiers")
    clip_grid: Optional[Tuple[float, ...]] = _key(None, _grid, "clip ratios of the search; null: the default grid")
    symmetric: bool = _key(True, _bool, "false: the NPU's int4 tiers with a group size (w4a4-g32, ...) give each "
                           "group a float16 offset too (affine groups, codes -8..7); other tiers stay symmetric")

    def _cross(self) -> None:
        if not self.symmetric and self.sr:
            raise RecipeError("rounding.symmetric", "rounding.symmetric=False (affine groups) has no stochastic rounding")
        if self.gptq_sequential and self.method != "gptq":
            raise RecipeError("rounding.gptq_sequential", "rounding.gptq_sequential=True applies to "
                              "rounding.method='gptq' only")
        if self.gptq_precision != "float64" and self.method != "gptq":
            raise RecipeError("rounding.gptq_precision", f"rounding.gptq_precision={self.gptq_precision!r} applies to "
                              "rounding.method='gptq' only")
        if self.method == "gptq" and self.sr:
            raise RecipeError("rounding.sr", "rounding.method='gptq' and rounding.sr=True exclude each other: GPTQ "
                              "chooses every int8 code itself")


class ActivationSpec:
    """The recipe's activation section. Its value is an :class:`orkpy.ActSpec` -- the one
    activation-spec type from the API to the kernels -- at model level: ``mode``, ``bits``,
    ``method`` (how a static range is calibrated), ``prefix`` (the leading positions the
    calibration leaves out and the shared-range modes quantize per token; default
    :data:`orkpy.runtime.actcal.DEFAULT_PREFIX`), ``n_outliers`` and ``groups`` (a scale per token and weight
    group where the weight has group-wise scales; default False, ``--npu-bits`` turns it on); a linear's own
    ``clip`` / ``channels`` come from the calibration. This class only reads and writes the section."""

    NAME: ClassVar[str] = "activation"
    KEYS: ClassVar[Tuple[str, ...]] = ("mode", "bits", "method", "prefix", "n_outliers", "groups")

    @classmethod
    def keys(cls) -> List[str]:
        return list(cls.KEYS)

    @staticmethod
    def default() -> ActSpec:
        return ActSpec(prefix=actcal.DEFAULT_PREFIX, groups=False)

    @classmethod
    def to_dict(cls, spec: ActSpec) -> Dict[str, Any]:
        return {k: getattr(spec, k) for k in cls.KEYS}

    @classmethod
    def from_dict(cls, d: Any) -> ActSpec:
        if not isinstance(d, Mapping):
            raise RecipeError(cls.NAME, f"{cls.NAME} must be a table (a JSON object) of {', '.join(cls.KEYS)}, got "
                                        f"{_show(d)}")
        _no_unknown(d, cls.KEYS, cls.NAME)
        kw = cls.to_dict(cls.default())
        for k in cls.KEYS:  # each key on the defaults first, so an error names the key that is wrong
            if k in d:
                try:
                    ActSpec(**dict(kw, **{k: d[k]}) if k != "mode" else {"mode": d[k]})
                except (TypeError, ValueError, KeyError) as e:  # ActSpec says act / act_prefix / ... (load_model's words)
                    msg = re.sub(r"^(act_prefix|act_method|act_outliers|act bits|act)\b", f"{cls.NAME}.{k}", str(e))
                    raise RecipeError(f"{cls.NAME}.{k}", msg if msg != str(e) else f"{cls.NAME}.{k}: {e}") from None
        kw.update(d)
        try:
            return ActSpec(**kw)
        except (TypeError, ValueError, KeyError) as e:
            raise RecipeError(cls.NAME, f"{cls.NAME}: {e}") from None


SECTIONS: Tuple[type, ...] = (TransformSpec, CalibrationSpec, AllocationSpec, RoundingSpec, ActivationSpec)
_SECTION_TYPE: Dict[type, type] = {ActivationSpec: ActSpec}  # a section whose value is of another type


# ------------------------------------------------------------------ the recipe --

@dataclass(frozen=True)
class Recipe:
    """How a model is quantized (module doc): the sections, each defaulted, and ``version``."""

    transform: TransformSpec = field(default_factory=TransformSpec)
    calibration: CalibrationSpec = field(default_factory=CalibrationSpec)
    allocation: AllocationSpec = field(default_factory=AllocationSpec)
    rounding: RoundingSpec = field(default_factory=RoundingSpec)
    activation: ActSpec = field(default_factory=ActivationSpec.default)
    version: int = VERSION

    def __post_init__(self) -> None:
        if not _is_int(self.version) or self.version != VERSION:
            raise RecipeError("version", f"version must be {VERSION} (this orkpy's recipe format), got "
                                         f"{_show(self.version)}")
        for cls in SECTIONS:
            want = _SECTION_TYPE.get(cls, cls)
            if not isinstance(getattr(self, cls.NAME), want):  # type: ignore[attr-defined]
                raise RecipeError(cls.NAME, f"{cls.NAME} must be a {want.__name__}, got "  # type: ignore[attr-defined]
                                  f"{type(getattr(self, cls.NAME)).__name__}")  # type: ignore[attr-defined]
        if self.activation.clip is not None or self.activation.channels is not None:
            raise RecipeError("activation", "a recipe's activation spec is the model's: a linear's clip / channels "
                              "come from the calibration")
        r, a = self.rounding, self.allocation
        if r.clip_search == "full" and (r.method == "gptq" or r.awq or a.target_bpw is not None):
            raise RecipeError("rounding.clip_search", "rounding.clip_search='full' applies to the plain rounding of the "
                              "linears (rounding.method='rtn', no rounding.awq, an allocation oracle rather than "
                              "allocation.target_bpw): GPTQ's scales, AWQ's and target_bpw's searches use the "
                              "screened search")
        if r.awq and self.transform.smooth is not None:
            raise RecipeError("rounding.awq", "rounding.awq=True and transform.smooth fold scales into the same places: "
                              "choose one")
        if not r.symmetric and a.target_bpw is not None:  # it measures and sizes its options symmetric
            raise RecipeError("rounding.symmetric", "rounding.symmetric=False applies to allocation.npu_bits or an "
                              "allocation oracle, not allocation.target_bpw")

    # -- what a run needs besides the recipe
    @property
    def needs_calib(self) -> Optional[str]:
        """The key that needs a calibration text (None: the recipe runs without one)."""
        t, a, r = self.transform, self.allocation, self.rounding
        for key, on in (("transform.smooth", t.smooth is not None), ("allocation.target_bpw", a.target_bpw is not None),
                        ("allocation.npu_bits", a.npu_bits is not None),
                        ("rounding.method", r.method == "gptq"), ("rounding.awq", r.awq),
                        ("activation.mode", self.activation.info.calibrated)):
            if on:
                return key
        return None

    def check_inputs(self, alloc_given: bool, calib_given: bool) -> None:
        """The checks between the recipe and its inputs (an allocation oracle, a calibration text),
        run before any file is read."""
        a, r = self.allocation, self.rounding
        if a.npu_bits is not None and alloc_given:
            raise RecipeError("allocation.npu_bits", "give either alloc= (an allocation oracle) or "
                              "allocation.npu_bits (an NPU budget), not both")
        if a.target_bpw is not None and alloc_given:
            raise RecipeError("allocation.target_bpw", "give either alloc= (an allocation oracle) or "
                              "allocation.target_bpw (a size), not both")
        if a.target_bpw is None and a.npu_bits is None and not alloc_given:
            raise RecipeError("allocation.target_bpw", "alloc= is required (a mixed GGUF, an emit-map or a TierMap) "
                              "unless allocation.target_bpw or allocation.npu_bits is given")
        if calib_given:
            return
        why = {"transform.smooth": "transform.smooth needs calib= (the migration scales come from calibration "
                                   "activations)",
               "allocation.target_bpw": "allocation.target_bpw needs calib= (the text its sensitivities are measured "
                                        "on)",
               "allocation.npu_bits": "allocation.npu_bits needs calib= (the text its sensitivities are measured on)",
               "rounding.method": f"rounding.method={r.method!r} needs calib= (a calibration text or token ids, not "
                                  "the scored text)",
               "rounding.awq": "rounding.awq=True needs calib= (a calibration text or token ids, not the scored text)",
               "activation.mode": f"activation.mode={self.activation.mode!r} needs calib= (its ranges and outlier "
                                  "channels are calibrated and saved with the model)"}
        key = self.needs_calib
        if key is not None:
            raise RecipeError(key, why[key])

    # -- serialization
    def to_dict(self) -> Dict[str, Any]:
        """Every key (defaults included), JSON-ready: two recipes that mean the same give the same dict."""
        out: Dict[str, Any] = {"version": self.version}
        for cls in SECTIONS:
            sec = getattr(self, cls.NAME)  # type: ignore[attr-defined]
            out[cls.NAME] = ActivationSpec.to_dict(sec) if cls is ActivationSpec else sec.to_dict()  # type: ignore[attr-defined]
        return out

    @classmethod
    def from_dict(cls, d: Any, file: Optional[str] = None, lines: Optional[Mapping[Key, int]] = None) -> "Recipe":
        """A recipe from a parsed JSON / TOML document (keys left out take their defaults);
        ``file`` / ``lines`` (key path -> line) locate an error."""
        try:
            if not isinstance(d, Mapping):
                raise RecipeError("", f"a recipe must be a table (a JSON object), got {_show(d)}")
            _no_unknown(d, ["version"] + [s.NAME for s in SECTIONS], "")  # type: ignore[attr-defined]
            parts = {s.NAME: s.from_dict(d.get(s.NAME, {})) for s in SECTIONS}  # type: ignore[attr-defined]
            return cls(version=d.get("version", VERSION), **parts)
        except RecipeError as e:
            if file is None and lines is None:
                raise
            raise e.located(file, lines or {}) from None

    def dumps(self, fmt: str = "json") -> str:
        """The recipe as text: ``"json"`` (every key; null for none) or ``"toml"`` (keys that are
        none left out: TOML has no null)."""
        d = self.to_dict()
        if fmt == "json":
            return json.dumps(d, indent=2) + "\n"
        if fmt != "toml":
            raise ValueError(f"fmt must be 'json' or 'toml', got {fmt!r}")
        out = [f"version = {d.pop('version')}"]
        for name, sec in d.items():
            out += ["", f"[{name}]"] + [f"{k} = {_toml_value(v)}" for k, v in sec.items() if v is not None]
        return "\n".join(out) + "\n"

    @classmethod
    def loads(cls, text: str, fmt: str = "json", file: Optional[str] = None) -> "Recipe":
        """A recipe from text (``fmt`` "json" or "toml"); errors name ``file`` and the line."""
        where = file or "recipe"
        if fmt == "toml":
            data, lines = _parse_toml(text, where), _toml_key_lines(text)
        elif fmt == "json":
            data, lines = _parse_json(text, where), _json_key_lines(text)
        else:
            raise ValueError(f"fmt must be 'json' or 'toml', got {fmt!r}")
        if isinstance(data, dict) and data.get("format") == _MANIFEST_FORMAT:  # a model directory's manifest
            if not isinstance(data.get("recipe"), dict):
                raise RecipeError("recipe", f"{where}: a model manifest without a recipe (written before orkpy "
                                            "recorded recipes): nothing to re-run")
            data = data["recipe"]
            lines = {k[1:]: v for k, v in lines.items() if k[:1] == ("recipe",) and len(k) > 1}
        return cls.from_dict(data, where, lines)

    @classmethod
    def load(cls, path: StrPath) -> "Recipe":
        """Read a recipe file (``.toml``: TOML, anything else: JSON), or the recipe a model
        directory (or its ``manifest.json``) was made with."""
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, "manifest.json")
        try:
            with open(path, "rb") as f:
                raw = f.read(1 << 20)
        except OSError as e:
            raise OSError(e.errno, f"recipe {path}: cannot read it ({e.strerror or e})") from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise RecipeError("", f"{path}: not UTF-8 text ({e})") from None
        return cls.loads(text, "toml" if path.endswith(".toml") else "json", path)

    # -- the keyword form of quantize_model
    @classmethod
    def from_kwargs(cls, **kw: Any) -> "Recipe":
        """The recipe of :func:`orkpy.quantize_model`'s keywords (:data:`KEYWORDS`; each key's
        default when left out)."""
        d: Dict[str, Dict[str, Any]] = {s.NAME: {} for s in SECTIONS}  # type: ignore[attr-defined]
        for k, v in kw.items():
            if k not in KEYWORDS:
                raise TypeError(f"{k!r} is not a recipe keyword of quantize_model")
            sec, key = KEYWORDS[k]
            d[sec][key] = v
        return cls.from_dict(d)

    def to_kwargs(self) -> Dict[str, Any]:
        """quantize_model's keywords meaning this recipe (the inverse of :meth:`from_kwargs`)."""
        return {k: getattr(getattr(self, sec), key) for k, (sec, key) in KEYWORDS.items()}


#: quantize_model keyword -> (section, key)
KEYWORDS: Dict[str, Tuple[str, str]] = {
    "rotate": ("transform", "rotate"), "rotate_seed": ("transform", "rotate_seed"),
    "rotate_online": ("transform", "rotate_online"), "rotate_placement": ("transform", "rotate_placement"),
    "smooth": ("transform", "smooth"),
    "calib_ctx": ("calibration", "ctx"), "calib_chunks": ("calibration", "chunks"),
    "threshold": ("allocation", "threshold"), "fallback": ("allocation", "fallback"),
    "target_bpw": ("allocation", "target_bpw"), "target_options": ("allocation", "target_options"),
    "npu_bits": ("allocation", "npu_bits"), "npu_options": ("allocation", "npu_options"),
    "npu_per_linear": ("allocation", "npu_per_linear"),
    "target_chunks": ("allocation", "target_chunks"), "target_ctx": ("allocation", "target_ctx"),
    "target_sensitivity": ("allocation", "target_sensitivity"),
    "kind": ("allocation", "kind"), "group_size": ("allocation", "group_size"),
    "tied_lookup": ("allocation", "tied_lookup"),
    "method": ("rounding", "method"), "gptq_sequential": ("rounding", "gptq_sequential"),
    "gptq_precision": ("rounding", "gptq_precision"),
    "awq": ("rounding", "awq"), "sr": ("rounding", "sr"), "seed": ("rounding", "seed"),
    "clip_search": ("rounding", "clip_search"), "clip_grid": ("rounding", "clip_grid"),
    "symmetric": ("rounding", "symmetric"),
    "act_prefix": ("activation", "prefix"), "act_groups": ("activation", "groups"),
}


def keywords_given(kw: Mapping[str, Any]) -> List[str]:
    """The recipe keywords in ``kw`` not at their defaults (with ``recipe=``, none may be)."""
    default = Recipe().to_kwargs()
    out = []
    for k, v in kw.items():
        d = default[k]
        if (v is None) != (d is None) or (v is not None and d is not None and v != d):
            out.append(k)
    return out


# ------------------------------------------------------------------ text formats --

def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _parse_json(text: str, where: str) -> Any:
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=json_finite_float)
    except json.JSONDecodeError as e:
        raise RecipeError("", f"{where}:{e.lineno}: not valid JSON ({e.msg}, column {e.colno})") from None
    except (ValueError, RecursionError) as e:
        raise RecipeError("", f"{where}: not valid JSON ({e})") from None


def _json_key_lines(text: str) -> Dict[Key, int]:
    """{key path: line} of every object key of a valid JSON document."""
    out: Dict[Key, int] = {}
    stack: List[List[Any]] = []  # per open container: [bracket, current key]
    pending: Optional[Tuple[str, int]] = None  # the last string and its line
    i, line = 0, 1
    while i < len(text):
        c = text[i]
        if c == "\n":
            line += 1
        elif c == '"':
            j = i + 1
            while text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            pending, i = (json.loads(text[i:j + 1]), line), j
        elif c == ":" and pending is not None and stack and stack[-1][0] == "{":
            stack[-1][1] = pending[0]
            out.setdefault(tuple(k for b, k in stack if b == "{"), pending[1])
        elif c in "{[":
            stack.append([c, None])
        elif c in "}]":
            stack.pop()
        if c != '"':
            pending = pending if c in " \t\r\n" else None
        i += 1
    return out


def _parse_toml(text: str, where: str) -> Any:
    if sys.version_info >= (3, 11):
        import tomllib
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            m = re.search(r"\(at line (\d+), column (\d+)\)", str(e))
            loc = f":{m.group(1)}" if m else ""
            raise RecipeError("", f"{where}{loc}: not valid TOML ({e})") from None
    raise RecipeError("", f"{where}: a TOML recipe needs Python 3.11+ (the standard library's tomllib); on this "
                          f"Python {sys.version_info[0]}.{sys.version_info[1]} write it as JSON (`orkpy recipe` prints "
                          "one)")


_TOML_TABLE = re.compile(r"\[\s*([A-Za-z0-9_.\- \"]+?)\s*\]\s*(#.*)?$")
_TOML_KEY = re.compile(r"([A-Za-z0-9_.\-\" ]+?)\s*=")


def _toml_key_lines(text: str) -> Dict[Key, int]:
    """{key path: line} of a TOML document's tables and ``key = value`` lines (dotted keys
    included; enough to point at the line of a recipe key)."""
    out: Dict[Key, int] = {}
    table: Key = ()
    for no, raw in enumerate(text.splitlines(), 1):
        s = raw.strip()
        m = _TOML_TABLE.match(s)
        if m and not s.startswith("[["):
            table = tuple(p.strip().strip('"') for p in m.group(1).split("."))
            out.setdefault(table, no)
            continue
        m = _TOML_KEY.match(s)
        if m:
            key = table + tuple(p.strip().strip('"') for p in m.group(1).split("."))
            for n in range(len(table) + 1, len(key) + 1):
                out.setdefault(key[:n], no)
    return out


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    return "[" + ", ".join(_toml_value(x) for x in v) + "]"


__all__ = ["KEYWORDS", "ActivationSpec", "AllocationSpec", "CalibrationSpec", "Recipe", "RecipeError",
           "RoundingSpec", "SECTIONS", "TransformSpec", "VERSION", "keywords_given"]
