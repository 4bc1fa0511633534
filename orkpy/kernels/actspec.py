"""The activation spec: how a packed linear's float input becomes int8, one value from the API
to the kernels (csrc/ork/actspec.h is the contract).

:class:`ActSpec` is a frozen value with the fields

- ``mode``: a registered activation mode (:data:`ACT_MODES`, from the C registry
  ``_core.act_modes()``: ``per_token``, ``per_tensor``, ``static``, ``per_token_outliers``);
- ``bits``: activation bits (8 or 4; the registry row lists the widths a mode serves);
- ``method``: how a static mode's range is calibrated (``"mse"`` or ``"max"``,
  :mod:`orkpy.runtime.actcal`);
- ``prefix``: the sequence positions quantized per token with a mode whose rows share a range
  (None: the default, the calibration's for a static mode, 0 otherwise);
- ``n_outliers``: how many outlier channels a mode that keeps them takes from the calibration;
- ``groups``: whether a linear whose weight has group-wise scales also scales its activations per
  group (one scale per token and weight group, a per-row mode only; None / False: one per token);

and, for one linear (a *resolved* spec, :func:`orkpy.runtime.actcal.resolve`), ``clip`` (the static
range, float32), ``channels`` (the outlier input channels, strictly increasing) and ``search`` (the
per-row range search of a 4-bit per-row mode: each token's range minimises its own squared error,
csrc/ork/actspec.h) and ``digits`` (8-bit codes stopping at +-119, so each is two int4 digits: a
``w4a8`` linear's, the NPU's int4 mode at two rows per token) and ``group`` (the activation group size,
the weight's group when ``groups`` holds: each token's inputs scaled per group of ``group``, every
rule above per group, csrc/ork/actspec.h "group"; the NPU's int16 block of a weight group is scaled
on the host anyway, so this costs no NPU bytes). ``bits`` is 8 (codes in [-127, 127]) or
4 (codes in [-7, 7], [-8, 7] when searched: a ``w4a4``
linear's, the NPU's int4 x int4 mode; a linear runs the smaller of the spec's and its kind's
``act_bits``, docs/w4a4.md). The
model-level spec (``load_model(act=ActSpec(...))``) leaves ``clip`` and ``channels`` None.
Every check lives in ``__post_init__`` (ValueError naming the field); the C core checks the
spec it receives once more (``ork_act_spec_check``). :meth:`ActSpec.parse` turns the legacy
arguments (``act="static", act_method=..., act_outliers=..., act_prefix=...``) into a spec;
:meth:`ActSpec.to_dict` / :meth:`ActSpec.from_dict` serialize it (a recipe embeds it), and
:meth:`ActSpec.to_core` is the one argument the C binding reads (``orkpy_act_spec_from_py``).

Adding a mode is a row in csrc/ork/actspec.c (its kernel and flags): its name appears here,
in the CLI's ``--act`` choices and everywhere a mode is accepted, and its flags say what it
takes from a calibration (``static``: a range; ``outliers``: channels).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any, Dict, Mapping, Optional, Tuple, Union, cast

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .. import _core


@dataclass(frozen=True)
class ActModeInfo:
    """One row of the activation mode registry (csrc/ork/actspec.h)."""

    name: str
    id: int
    static: bool       # calibrated static range (clip)
    per_tensor: bool   # one dynamic range for a call's rows
    outliers: bool     # outlier channels from the calibration
    bits: Tuple[int, ...]

    @property
    def calibrated(self) -> bool:
        """Whether the mode needs an activation calibration (a range or channels)."""
        return self.static or self.outliers

    @property
    def shares_rows(self) -> bool:
        """Whether rows share a range, so a per-token prefix applies."""
        return self.static or self.per_tensor


#: the activation mode registry's rows by name, in id order (the C table)
ACT_MODE_INFO: Mapping[str, ActModeInfo] = MappingProxyType({
    r["name"]: ActModeInfo(r["name"], int(r["id"]), bool(r["static"]), bool(r["per_tensor"]), bool(r["outliers"]),
                           tuple(int(b) for b in r["bits"])) for r in _core.act_modes()})
#: the activation modes of ``load_model(act=...)``, ``PackedWeight.matmul`` and ``--act``
ACT_MODES: Tuple[str, ...] = tuple(ACT_MODE_INFO)
#: how a static range is calibrated (orkpy.runtime.actcal)
ACT_METHODS = ("mse", "max")
#: outlier channels per linear by default
DEFAULT_OUTLIERS = 8
#: leading positions the calibration leaves out and the static mode quantizes per token
DEFAULT_PREFIX = 1
#: the smallest static range (ORK_QUANT_TINY)
MIN_CLIP = 1e-30


#: the largest prefix / outlier count (sequence positions and input channels are below 2^31)
COUNT_MAX = 2 ** 31 - 1


def _is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def mode_info(mode: str) -> ActModeInfo:
    """The registry row of ``mode``; ValueError listing the modes."""
    info = ACT_MODE_INFO.get(mode) if isinstance(mode, str) else None
    if info is None:
        raise ValueError(f"act must be one of {', '.join(repr(m) for m in ACT_MODES)}, got {mode!r}")
    return info


@dataclass(frozen=True)
class ActSpec:
    """An activation spec (see module doc). ``ActSpec()`` is per token, 8 bits."""

    mode: str = "per_token"
    bits: int = 8
    method: str = "mse"
    prefix: Optional[int] = None
    n_outliers: int = DEFAULT_OUTLIERS
    clip: Optional[float] = None
    channels: Optional[Tuple[int, ...]] = None
    search: Optional[bool] = None
    digits: Optional[bool] = None
    groups: Optional[bool] = None
    group: Optional[int] = None

    def __post_init__(self) -> None:
        info = mode_info(self.mode)
        if not _is_int(self.bits) or int(self.bits) not in info.bits:
            raise ValueError(f"act bits must be one of {list(info.bits)} for mode {self.mode!r}, got {self.bits!r}")
        if self.method not in ACT_METHODS:
            raise ValueError(f"act_method must be one of {', '.join(repr(m) for m in ACT_METHODS)}, got {self.method!r}")
        if self.prefix is not None and not (_is_int(self.prefix) and self.prefix >= 0):
            raise ValueError(f"act_prefix must be an int >= 0, got {self.prefix!r}")
        if self.prefix is not None and self.prefix > COUNT_MAX:
            raise ValueError(f"act_prefix must be an int >= 0 below 2^31, got {self.prefix!r:.40}")
        if not (_is_int(self.n_outliers) and self.n_outliers >= 1):
            raise ValueError(f"act_outliers must be a positive int, got {self.n_outliers!r}")
        if self.n_outliers > COUNT_MAX:
            raise ValueError(f"act_outliers must be a positive int below 2^31, got {self.n_outliers!r:.40}")
        clip = self.clip
        if clip is not None:
            if not info.static:
                raise ValueError(f"clip= is a static range: mode {self.mode!r} takes none (only a static mode does)")
            with np.errstate(over="ignore"):  # a range past float32 is refused below, not warned about
                c = float(np.float32(clip)) if isinstance(clip, (int, float, np.number)) and not isinstance(clip, bool) \
                    else math.nan
            if not (math.isfinite(c) and c >= MIN_CLIP):
                raise ValueError(f"static activation range {clip!r} is not a finite float32 >= {MIN_CLIP:g} (a static "
                                 "mode's clip)")
            clip = c
        ch = self.channels
        if ch is not None:
            a = np.asarray(ch)
            if a.ndim != 1 or not (a.size == 0 or np.issubdtype(a.dtype, np.integer)):
                raise ValueError("outlier channels must be a 1-D integer array")
            if a.size and (a.min() < 0 or a.max() >= 2 ** 31 or np.any(np.diff(a) <= 0)):
                raise ValueError(f"outlier channels must be strictly increasing and >= 0, got {a.tolist()[:10]}")
            ch = tuple(int(c) for c in a)
        if self.search is not None:
            if not isinstance(self.search, (bool, np.bool_)):
                raise ValueError(f"search must be a bool (the per-row range search), got {self.search!r}")
            if self.search and (int(self.bits) >= 8 or info.shares_rows):
                raise ValueError(f"search=True is the per-row range search of a mode whose rows have their own "
                                 f"range, below 8 bits (mode {self.mode!r}, bits {self.bits})")
        if self.digits is not None:
            if not isinstance(self.digits, (bool, np.bool_)):
                raise ValueError(f"digits must be a bool (int8 codes in [-119, 119], two int4 digits), got {self.digits!r}")
            if self.digits and int(self.bits) != 8:
                raise ValueError(f"digits=True splits 8-bit activations into two int4 digits: bits must be 8, got {self.bits}")
        if self.groups is not None and not isinstance(self.groups, (bool, np.bool_)):
            raise ValueError(f"groups must be a bool (activation scales per weight group), got {self.groups!r}")
        if self.groups and info.shares_rows:
            raise ValueError(f"groups=True gives each token a scale per weight group: mode {self.mode!r} shares one "
                             "range across rows (per-row modes only)")
        if self.group is not None:
            if not (_is_int(self.group) and self.group >= 0 and self.group % 32 == 0 and self.group <= COUNT_MAX):
                raise ValueError(f"the activation group must be 0 or a positive multiple of 32, got {self.group!r:.40}")
            if self.group and info.shares_rows:
                raise ValueError(f"an activation group needs a per-row mode, not {self.mode!r}")
        for name, v in (("search", None if self.search is None else bool(self.search)),
                        ("groups", None if self.groups is None else bool(self.groups)),
                        ("group", None if self.group is None else int(self.group)),
                        ("digits", None if self.digits is None else bool(self.digits)), ("bits", int(self.bits)), ("n_outliers", int(self.n_outliers)), ("clip", clip),
                        ("channels", ch), ("prefix", None if self.prefix is None else int(self.prefix))):
            object.__setattr__(self, name, v)

    # ---------------------------------------------------------- queries --
    @property
    def info(self) -> ActModeInfo:
        """The mode's registry row."""
        return ACT_MODE_INFO[self.mode]

    @property
    def resolved(self) -> bool:
        """Whether the spec holds what its mode needs for one linear (a static range, channels)."""
        return (self.clip is not None or not self.info.static) and (self.channels is not None or not self.info.outliers)

    def check_width(self, K: int) -> None:
        """ValueError unless every outlier channel is below ``K`` (the linear's inputs)."""
        if self.channels and self.channels[-1] >= K:
            raise ValueError(f"outlier channels must be strictly increasing in [0, {K}), got {list(self.channels)[:10]}")

    def outlier_array(self) -> Optional[NDArray[np.int32]]:
        """The outlier channels as int32 (None when the spec has none)."""
        return None if self.channels is None else np.array(self.channels, np.int32)

    def to_core(self) -> Dict[str, Any]:
        """The argument the C binding reads (csrc/py/coerce.c ``orkpy_act_spec_from_py``)."""
        return {"mode": self.mode, "bits": self.bits, "clip": 0.0 if self.clip is None else self.clip,
                "prefix": self.prefix or 0, "outliers": self.outlier_array(), "search": bool(self.search),
                "digits": bool(self.digits), "group": self.group or 0}

    # ------------------------------------------------------- conversion --
    @classmethod
    def parse(cls, act: Union[str, ActSpec, Mapping[str, Any]] = "per_token", act_method: Optional[str] = None,
              act_outliers: Optional[int] = None, act_prefix: Optional[int] = None) -> ActSpec:
        """A spec from ``load_model``'s arguments: a mode name with the legacy ``act_method`` /
        ``act_outliers`` / ``act_prefix`` (None: the defaults), an ActSpec (the legacy arguments
        must then be None: they live in the spec) or a dict (:meth:`from_dict`)."""
        if isinstance(act, str):
            return cls(act, method="mse" if act_method is None else act_method,
                       n_outliers=DEFAULT_OUTLIERS if act_outliers is None else act_outliers, prefix=act_prefix)
        given = [n for n, v in (("act_method", act_method), ("act_outliers", act_outliers), ("act_prefix", act_prefix))
                 if v is not None]
        if isinstance(act, Mapping):
            act = cls.from_dict(act)
        if not isinstance(act, ActSpec):
            raise TypeError(f"act must be a mode name, an ActSpec or a dict, got {type(act).__name__}")
        if given:
            raise ValueError(f"{', '.join(given)} belong in the ActSpec when act= is one (ActSpec(method=..., "
                             "n_outliers=..., prefix=...))")
        return act

    def to_dict(self) -> Dict[str, Any]:
        """The spec as JSON / TOML values (None fields left out)."""
        out: Dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is not None:
                out[f.name] = list(v) if f.name == "channels" else v
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ActSpec:
        """The inverse of :meth:`to_dict`; ValueError naming an unknown key."""
        if not isinstance(d, Mapping):
            raise TypeError(f"an ActSpec dict must be a mapping, got {type(d).__name__}")
        names = [f.name for f in fields(cls)]
        unknown = [k for k in d if k not in names]
        if unknown:
            raise ValueError(f"unknown ActSpec key {unknown[0]!r} (expected {', '.join(names)})")
        if "mode" not in d:
            raise ValueError("an ActSpec dict needs 'mode'")
        kw = dict(d)
        if kw.get("channels") is not None:
            kw["channels"] = tuple(kw["channels"])
        return cls(**kw)

    @classmethod
    def from_keywords(cls, per_tensor: bool = False, clip: Optional[float] = None, outliers: Optional[ArrayLike] = None,
                      prefix: int = 0) -> ActSpec:
        """The spec the loose keywords of ``LinearSpec.from_packed`` describe: the registered mode
        whose flags they set (``clip``: a static mode; ``per_tensor``: one range per call;
        ``outliers``: outlier channels), the first row of the table when several match."""
        want = (clip is not None, bool(per_tensor) and clip is None, outliers is not None)
        for info in ACT_MODE_INFO.values():
            if (info.static, info.per_tensor, info.outliers) == want:
                return cls(info.name, clip=clip, prefix=prefix,
                           channels=None if outliers is None else cast(Any, np.asarray(outliers)))
        raise ValueError(f"no activation mode is {'static' if want[0] else 'dynamic'}"
                         f"{', per tensor' if want[1] else ''}{' with outlier channels' if want[2] else ''}")

    @classmethod
    def for_matmul(cls, act: Union[str, ActSpec], clip: Optional[float] = None, outliers: Optional[ArrayLike] = None,
                   prefix: Optional[int] = None) -> ActSpec:
        """The spec of ``PackedWeight.matmul(x, act, clip=, outliers=, prefix=)``: a mode name with
        its range and channels, or a resolved ActSpec (the keywords then None)."""
        if isinstance(act, ActSpec):
            if clip is not None or outliers is not None or prefix is not None:
                raise ValueError("clip= / outliers= / prefix= belong in the ActSpec when act= is one")
            spec = act
        else:
            info = mode_info(act)
            if info.static and clip is None:
                raise ValueError(f"act={act!r} needs clip= (its range)")
            try:
                spec = cls(act, clip=clip, prefix=prefix,
                           channels=None if outliers is None else cast(Any, np.asarray(outliers)))
            except ValueError as e:  # matmul's own keyword names
                raise ValueError(re.sub(r"^act_prefix\b", "prefix", str(e))) from None
        if not spec.resolved:
            raise ValueError(f"act={spec.mode!r} needs " + ("clip= (its range)" if spec.clip is None and spec.info.static
                                                             else "outliers= (the input channels computed in float)"))
        return spec


__all__ = ["ACT_METHODS", "ACT_MODES", "ACT_MODE_INFO", "ActModeInfo", "ActSpec", "DEFAULT_OUTLIERS", "DEFAULT_PREFIX",
           "mode_info"]
