"""Activation-scale modes of the packed linears and their calibration.

A packed linear (w8a8, w4a8) multiplies int8 activations; ``load_model(..., act=)`` says
how its float input becomes int8 (csrc/ork/linear.h is the contract):

- ``"per_token"`` (default): one dynamic scale per token, ``absmax(row) / 127``;
- ``"per_tensor"``: one dynamic scale for all tokens of a forward call;
- ``"static"``: one fixed range ``c`` per linear, calibrated once: ``q = clamp(round(x * 127 /
  c), -127, 127)``, step ``c / 127``; values beyond ``+-c`` saturate. Nothing about the input
  is measured at run time, which is what lets the NPU chain one matmul into the next without
  a host round trip. ``c`` equal to a batch's absmax gives exactly the per-tensor result.
  With a prefix ``p`` (``act_prefix``; by default the calibration's), the block linears
  quantize the sequence's first ``p`` positions per token: the first token carries massive
  activations (the attention sink; SmolLM2's ``ffn_down`` inputs reach 428 there, 10-100x
  the other tokens') that no shared range serves, and a device computes it once, at
  prefill (PrefixQuant's observation). The calibration then leaves those positions out;
- ``"per_token_outliers"``: per token, but the ``k`` input channels with the largest
  calibration ``|x|`` are kept out of the int8 product and multiplied in float by the same
  (quantized) weight columns -- LLM.int8()'s decomposition. NPU cost: the int8 matmul keeps its
  shape, the host adds an ``M x k x N`` float product per linear and needs the input back.

Calibration (:func:`calibrate_activations`) runs the model on calibration text with
:meth:`orkpy.Model.collect_act_stats` (a histogram of ``|x|`` per linear: 64 bins per octave
from 2^-20 to 2^20, each with its count and sums of ``|x|`` and ``x^2``; and the largest
``|x|`` per input channel) and derives per linear:

- ``max``: the largest ``|x|`` seen (nothing saturates on the calibration text);
- ``mse``: the range minimising the mean squared quantization error of the calibration
  values, searched over every ``c = max * 2^(-i/32)``, ``i = 0..384`` (no percentile to
  choose): values above ``c`` cost ``(|x| - c)^2`` (exact from the bin sums), values below it
  the rounding error of a step ``c / 127``, integrated over each bin's span (uniform within
  a bin); ``c = max`` is evaluated first and a smaller range replaces it only when strictly
  better;
- ``outliers``: the :data:`SAVED_OUTLIERS` channels with the largest calibration ``|x|`` over
  every position (the prefix included: the per-token mode has none), largest first
  (``load_model(act_outliers=k)`` takes the first ``k``).

:class:`ActCalibration` holds them and is saved as ``act_scales.json`` in a model directory
(docs/formats.md). This module knows no model class: the calibration run takes any object with
``tokens``, ``chunks`` and ``collect_act_stats`` (:class:`orkpy.Model`).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import replace
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .. import _core
from .._core import FormatError
from .._io import atomic_write, counted, json_finite_float
from .._typing import StrPath
# the activation modes (the C registry), the range methods and the defaults live with the spec
from ..kernels.quant import KIND_INFO
from ..kernels.actspec import ACT_METHODS, ACT_MODES, DEFAULT_OUTLIERS, DEFAULT_PREFIX, ActSpec, mode_info

#: the key of a linear's MSE range on the 4-bit grid (+-7 steps), what method "mse" takes at 4 bits
MSE4 = "mse4"
#: outlier channels per linear in a saved calibration (``DEFAULT_OUTLIERS``: the default ``k``)
SAVED_OUTLIERS = 64
FILE = "act_scales.json"
FORMAT = "orkpy-act-scales"
VERSION = 1
FILE_MAX = 64 << 20
#: the MSE search: c = max * 2^(-i / GRID_PER_OCTAVE), i = 0 .. GRID_OCTAVES * GRID_PER_OCTAVE
GRID_PER_OCTAVE = 32
GRID_OCTAVES = 12

_EDGES: Optional[NDArray[np.float64]] = None


def hist_edges() -> NDArray[np.float64]:
    """Lower edges of the ``|x|`` histogram's bins, then ``inf`` (the C core's table)."""
    global _EDGES
    if _EDGES is None:
        _EDGES = _core.act_stats_edges()
    return _EDGES


def range_mse(count: ArrayLike, sums: ArrayLike, sums2: ArrayLike, clips: ArrayLike,
              qmax: int = 127, threads: Optional[int] = None) -> NDArray[np.float64]:
    """Total squared error of quantizing the histogrammed values with each static range of
    ``clips`` on a grid of ``+-qmax`` steps (see module doc): saturation above the range,
    rounding below it (csrc/ork/act_range.h: the formula, in C; the ranges split over
    ``threads``, the result independent of them)."""
    return _core.range_mse(np.asarray(count, np.float64), np.asarray(sums, np.float64),
                           np.asarray(sums2, np.float64), np.asarray(clips, np.float64), int(qmax),
                           0 if threads is None else int(threads))


def mse_clip(stats: Mapping[str, Any], qmax: int = 127) -> float:
    """The MSE-optimal static range of one linear's statistics (see module doc) on a grid of
    ``+-qmax`` steps (127: int8; 7: the 4-bit activations of a w4a4 linear), float32."""
    amax = float(stats["absmax"])
    if not amax > 0:
        return 0.0
    ratios = 2.0 ** (-np.arange(GRID_OCTAVES * GRID_PER_OCTAVE + 1) / GRID_PER_OCTAVE)
    clips = np.float32(amax) * ratios.astype(np.float32)
    clips = clips[clips >= np.float32(1e-30)]
    err = range_mse(stats["count"], stats["sum"], stats["sum2"], clips.astype(np.float64), qmax)
    best = 0
    for i in range(1, len(err)):  # the largest range wins ties
        if err[i] < err[best]:
            best = i
    return float(clips[best])


def clipped_share(stats: Mapping[str, Any], clip: float) -> float:
    """The share of the histogrammed values above ``clip`` (bins straddling it split evenly)."""
    edges = hist_edges()
    n = np.asarray(stats["count"], np.float64)
    total = n.sum()
    if total == 0:
        return 0.0
    lo, hi = edges[:-1], edges[1:]
    frac = np.where(lo >= clip, 1.0, np.where(hi <= clip, 0.0,
                                              np.where(np.isfinite(hi), (hi - clip) / np.where(np.isfinite(hi), hi - lo,
                                                                                                 1.0), 1.0)))
    return float((n * frac).sum() / total)


class ActCalibration:
    """Calibrated activation settings per linear: ``ranges[name]`` = ``{"max": c, "mse": c}``
    (float32 values), ``channels[name]`` = int32 input channels by calibration ``|x|``, largest
    first, with ``channel_absmax[name]``; ``info``: what calibrated them (text hash, n_ctx,
    chunks, ...). ``clips(method)``, ``outliers(k)``, ``save(path)``, ``load(path)``."""

    def __init__(self, ranges: Mapping[str, Mapping[str, float]], channels: Mapping[str, ArrayLike],
                 channel_absmax: Mapping[str, ArrayLike], info: Optional[Mapping[str, Any]] = None,
                 clipped: Optional[Mapping[str, Mapping[str, float]]] = None) -> None:
        self.ranges = {n: {m: float(np.float32(r[m])) for m in ACT_METHODS + (MSE4,) if m in r or m != MSE4}
                       for n, r in ranges.items()}
        self.channels = {n: np.asarray(channels[n], np.int32) for n in ranges}
        self.channel_absmax = {n: np.asarray(channel_absmax[n], np.float32) for n in ranges}
        self.info = dict(info or {})
        self.clipped = {n: dict(v) for n, v in (clipped or {}).items()}

    @property
    def prefix(self) -> int:
        """The leading positions the calibration left out (info["prefix"], 0 when absent)."""
        p = self.info.get("prefix", 0)
        return p if isinstance(p, int) and not isinstance(p, bool) and p >= 0 else 0

    def __contains__(self, name: object) -> bool:
        return name in self.ranges

    def __len__(self) -> int:
        return len(self.ranges)

    def clips(self, method: str = "mse") -> Dict[str, float]:
        """{linear name: static range} of a method (``"mse"`` or ``"max"``)."""
        check_method(method)
        return {n: r[method] for n, r in self.ranges.items()}

    def outliers(self, k: int = DEFAULT_OUTLIERS) -> Dict[str, NDArray[np.int32]]:
        """{linear name: the k channels of largest calibration |x|, in increasing order}."""
        k = check_outliers(k)
        out = {}
        for n, ch in self.channels.items():
            if k > len(ch):
                raise ValueError(f"act_outliers = {k} but the calibration kept {len(ch)} channels for {n!r}")
            out[n] = np.sort(ch[:k]).astype(np.int32)
        return out

    # ------------------------------------------------------------ files --
    def to_json(self) -> Dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "info": self.info,
                "linears": {n: {**{m: r[m] for m in ACT_METHODS + (MSE4,) if m in r}, "clipped": self.clipped.get(n, {}),
                                "outliers": [int(c) for c in self.channels[n]],
                                "outlier_absmax": [float(a) for a in self.channel_absmax[n]]}
                            for n, r in self.ranges.items()}}

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json(), indent=1, sort_keys=True, allow_nan=False).encode()

    def sha256(self) -> str:
        return hashlib.sha256(self.to_bytes()).hexdigest()

    def save(self, path: StrPath) -> None:
        atomic_write(path, [self.to_bytes()])

    @classmethod
    def from_bytes(cls, raw: bytes, where: str = "activation scales") -> ActCalibration:
        """Parse and check the JSON of :meth:`to_bytes`; FormatError naming ``where``."""
        def bad(msg: str) -> FormatError:
            return FormatError(f"{where}: {msg}")
        try:
            doc = json.loads(raw.decode("utf-8"), parse_constant=_no_constant, parse_float=json_finite_float)
        except (ValueError, RecursionError) as e:
            raise bad(f"not valid JSON ({type(e).__name__}: {str(e)[:200]})") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise bad("not an orkpy activation-scales file")
        if type(doc.get("version")) is not int or doc["version"] != VERSION:
            raise bad(f"unsupported version {doc.get('version')!r}")
        lin, info = doc.get("linears"), doc.get("info")
        if not isinstance(lin, dict) or not isinstance(info, dict):
            raise bad("'linears' and 'info' must be JSON objects")
        _check_info(info, bad)
        ranges, channels, absmax, clipped = {}, {}, {}, {}
        for n, ent in lin.items():
            if not isinstance(ent, dict):
                raise bad(f"entry {n!r} is not a JSON object")
            r = {}
            for m in ACT_METHODS + (MSE4,):
                if m == MSE4 and m not in ent:
                    continue
                r[m] = _number(ent.get(m), 0.0, FLT_MAX, bad, f"{n!r}: {m!r}", "a finite float32 >= 0")
            ch, am = ent.get("outliers"), ent.get("outlier_absmax")
            if not (isinstance(ch, list) and all(type(c) is int for c in ch) and len(set(ch)) == len(ch)
                    and all(0 <= c < 2 ** 31 for c in ch)):
                raise bad(f"{n!r}: 'outliers' must be a list of distinct channel numbers in [0, 2^31)")
            if not (isinstance(am, list) and len(am) == len(ch)):
                raise bad(f"{n!r}: 'outlier_absmax' must list one number per outlier channel")
            am = [_number(a, 0.0, FLT_MAX, bad, f"{n!r}: 'outlier_absmax' [{i}]", "a finite float32 >= 0")
                  for i, a in enumerate(am)]
            cl = ent.get("clipped", {})
            if not isinstance(cl, dict):
                raise bad(f"{n!r}: 'clipped' must map methods to numbers")
            cl = {k: _number(v, 0.0, 1.0, bad, f"{n!r}: 'clipped' {k!r}", "a share in [0, 1]") for k, v in cl.items()}
            ranges[n], channels[n], absmax[n], clipped[n] = r, ch, am, cl
        return cls(ranges, channels, absmax, info, clipped)

    @classmethod
    def load(cls, path: StrPath) -> ActCalibration:
        path = os.fspath(path)
        try:
            with open(path, "rb") as f:
                raw = f.read(FILE_MAX + 1)
        except OSError as e:
            raise FormatError(f"{path}: cannot read the activation scales ({e.strerror or e})") from None
        if len(raw) > FILE_MAX:
            raise FormatError(f"{path}: larger than {FILE_MAX >> 20} MiB")
        return cls.from_bytes(raw, path)

    def __repr__(self) -> str:
        return f"ActCalibration({len(self.ranges)} linears, {self.info.get('chunks')} chunks of {self.info.get('n_ctx')})"


#: the largest float32: the ranges and maxima are float32 values (a larger one would be infinite)
FLT_MAX = float(np.finfo(np.float32).max)
#: the sequence positions a count in ``info`` may name (C takes them as a Py_ssize_t; a context is < 2^31)
INFO_INT_MAX = 2 ** 31 - 1


def _number(v: Any, lo: float, hi: float, bad: Any, what: str, want: str) -> float:
    """A JSON number (not a bool) in [lo, hi]; ints of any size are compared exactly, never converted
    first (a 400-digit integer would overflow float)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise bad(f"{what} = {v!r:.40} is not a number ({want})")
    if isinstance(v, int):
        ok = lo <= v <= hi
    else:
        ok = math.isfinite(v) and lo <= v <= hi
    if not ok:
        raise bad(f"{what} = {v!r:.40} is out of range ({want})")
    return float(v)


def _count(v: Any, lo: int, bad: Any, what: str) -> int:
    if type(v) is not int or not lo <= v <= INFO_INT_MAX:
        raise bad(f"info {what} = {v!r:.40} is not an int in [{lo}, 2^31)")
    return v


def _check_info(info: Dict[str, Any], bad: Any) -> None:
    """What :func:`calibrate_activations` records; every key optional (a hand-made file), each checked
    when present: counts are ints (``prefix`` >= 0 and below ``n_ctx``, the others >= 1), text is text."""
    p = _count(info.get("prefix", 0), 0, bad, "'prefix'")
    if "n_ctx" in info:
        n_ctx = _count(info["n_ctx"], 1, bad, "'n_ctx'")
        if p >= n_ctx:   # the calibration would have seen no position of a block linear
            raise bad(f"info 'prefix' = {p} is not below 'n_ctx' = {n_ctx}")
    if "chunks" in info:
        _count(info["chunks"], 1, bad, "'chunks'")
    for k in ("model", "tokens_sha256"):
        if k in info and not isinstance(info[k], str):
            raise bad(f"info {k!r} = {info[k]!r:.40} is not a string")
    if "grid" in info:
        g = info["grid"]
        if not isinstance(g, dict):
            raise bad(f"info 'grid' = {g!r:.40} is not a JSON object")
        for k, v in g.items():
            _count(v, 1, bad, f"'grid' {k!r}")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def check_mode(act: str) -> str:
    return mode_info(act).name


def check_method(method: str) -> str:
    if method not in ACT_METHODS:
        raise ValueError(f"act_method must be one of {', '.join(repr(m) for m in ACT_METHODS)}, got {method!r}")
    return method


def check_prefix(p: Optional[int]) -> int:
    if not isinstance(p, (int, np.integer)) or isinstance(p, bool) or p < 0:
        raise ValueError(f"act_prefix must be an int >= 0, got {p!r}")
    if p > INFO_INT_MAX:
        raise ValueError(f"act_prefix must be an int >= 0 below 2^31, got {p!r:.40}")
    return int(p)


def check_outliers(k: int) -> int:
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
        raise ValueError(f"act_outliers must be a positive int, got {k!r}")
    return int(k)


def from_stats(stats: Mapping[str, Mapping[str, Any]], info: Optional[Mapping[str, Any]] = None,
               n_outliers: int = SAVED_OUTLIERS) -> ActCalibration:
    """An :class:`ActCalibration` from :meth:`orkpy.Model.collect_act_stats` results."""
    ranges, channels, absmax, clipped = {}, {}, {}, {}
    for name, s in stats.items():
        if int(s["rows"]) == 0:
            raise ValueError(f"no activations reached {name!r} during calibration")
        amax = float(np.float32(s["absmax"]))
        mse = mse_clip(s)
        ranges[name] = {"max": amax, "mse": mse, MSE4: mse_clip(s, 7)}
        clipped[name] = {"mse": clipped_share(s, mse)}
        ch = np.asarray(s["ch_absmax"], np.float32)
        order = np.argsort(-ch, kind="stable")[: min(n_outliers, len(ch))]
        channels[name], absmax[name] = order.astype(np.int32), ch[order]
    return ActCalibration(ranges, channels, absmax, info, clipped)


def calibrate_activations(model: Any, text_or_tokens: Union[str, ArrayLike], n_ctx: int = 512,
                          chunks: Optional[int] = 8, threads: Optional[int] = None, progress: bool = True,
                          n_outliers: int = SAVED_OUTLIERS, prefix: int = DEFAULT_PREFIX) -> ActCalibration:
    """Run ``model`` (an :class:`orkpy.Model`) over ``chunks`` chunks of ``n_ctx`` tokens of
    calibration text and calibrate every linear's static range (``max`` and ``mse``) and outlier
    channels (see module doc), the block linears' first ``prefix`` positions left out."""
    prefix = check_prefix(prefix)
    tokens = model.tokens(text_or_tokens)
    n_chunk, chunk_iter = model.chunks(tokens, n_ctx, chunks)
    with counted(chunk_iter, n_chunk, "act-calib", progress, "chunk") as each:
        stats = model.collect_act_stats(each, threads, prefix)
    info = {"model": os.path.basename(str(model.path)), "n_ctx": int(n_ctx), "chunks": int(n_chunk),
            "tokens_sha256": hashlib.sha256(np.asarray(tokens[: n_chunk * n_ctx], np.int32).tobytes()).hexdigest(),
            "prefix": prefix,
            "grid": {"per_octave": GRID_PER_OCTAVE, "octaves": GRID_OCTAVES}}
    return from_stats(stats, info, n_outliers)


def resolve(spec: ActSpec, name: str, calib: Optional[ActCalibration], K: int, where: str,
            kind: Optional[str] = None, group: int = 0) -> ActSpec:
    """The activation spec of one packed linear (``K`` inputs, weight ``kind``) from the model's: its
    width (``bits``: the smaller of the spec's and the kind's ``act_bits``, so a ``w4a4`` linear takes
    4-bit activations), what its mode's registry row asks of the calibration (a static mode: the
    range by ``spec.method``, on the 4-bit grid at 4 bits; a mode with outlier channels: the
    ``spec.n_outliers`` of largest calibration |x|, increasing), its prefix (rows sharing a range,
    and every mode at 4 bits: ``spec.prefix``, default the calibration's for a static mode,
    ``DEFAULT_PREFIX`` for a dynamic one at 4 bits (the attention sink stays int8) and 0 otherwise;
    0 on the head, which runs on other rows) and, at 4 bits with method "mse" in a per-row mode,
    the per-row range search (``search``); for a kind the NPU runs in its int4 mode with 8-bit
    activations (``w4a8``) the codes stop at +-119 (``digits``: two int4 digits each); with
    ``spec.groups`` and a weight with group-wise scales (``group`` > 0, the weight's group size) the
    activations take a scale per token and group (``group``). ValueError naming
    ``where`` and the linear when the calibration cannot provide them."""
    info = spec.info
    if spec.clip is not None or spec.channels is not None:
        raise ValueError(f"{where}: a model's ActSpec leaves clip and channels to the calibration (they are one "
                         "linear's settings)")
    bits = spec.bits if kind is None else min(spec.bits, KIND_INFO[kind].act_bits)
    clip: Optional[float] = None
    channels: Optional[Tuple[int, ...]] = None
    if info.calibrated:
        if calib is None:
            raise ValueError(f"act={spec.mode!r} needs calibrated activations and {where} has none: quantize with "
                             "calib=..., or pass calib= (a calibration text) or act_calib= (an ActCalibration / "
                             "act_scales.json)")
        if name not in calib:
            raise ValueError(f"{where}: the activation calibration has no entry for {name!r} (made for another model?)")
        ch = calib.channels[name]
        if len(ch) and int(ch.max()) >= K:
            raise ValueError(f"{where}: the activation calibration's channels for {name!r} exceed its K = {K} (made "
                             "for another model?)")
        if info.static:
            key = MSE4 if bits < 8 and spec.method == "mse" else spec.method
            if key not in calib.ranges[name]:
                raise ValueError(f"{where}: the activation calibration has no 4-bit range for {name!r} (made before "
                                 "w4a4 existed: calibrate again)")
            clip = calib.ranges[name][key]
            if not clip > 0:
                raise ValueError(f"{where}: {name!r} saw only zeros during calibration: no static range")
        if info.outliers:
            k = spec.n_outliers
            if k > len(ch):
                raise ValueError(f"{where}: act_outliers = {k} but the calibration kept {len(ch)} channels for {name!r}")
            channels = tuple(int(c) for c in np.sort(ch[:k]))
    prefix = 0
    if (info.shares_rows or bits < 8) and name != "output.weight":
        default = calib.prefix if (info.static and calib is not None) else (DEFAULT_PREFIX if bits < 8 else 0)
        prefix = default if spec.prefix is None else spec.prefix
    search = bits < 8 and spec.method == "mse" and not info.shares_rows
    ki = None if kind is None else KIND_INFO[kind]
    digits = bits == 8 and ki is not None and ki.levels is None and ki.store_bits == 4  # w4a8: two int4 digits
    agroup = int(group) if spec.groups and group and not info.shares_rows else None
    return replace(spec, bits=bits, clip=clip, channels=channels, prefix=prefix, search=search, digits=digits,
                   group=agroup)


def linear_act(act: str, name: str, calib: Optional[ActCalibration], method: str, k: int, where: str,
               K: int, prefix: Optional[int] = None) -> Dict[str, Any]:
    """``LinearSpec.from_packed``'s keywords for one packed linear: ``{"act_spec": resolve(...)}`` of the
    spec ``ActSpec.parse(act, method, k, prefix)`` (the legacy form of :func:`resolve`)."""
    return {"act_spec": resolve(ActSpec.parse(act, method, k, prefix), name, calib, K, where)}


def as_calibration(obj: Union[ActCalibration, StrPath, None]) -> Optional[ActCalibration]:
    """An ActCalibration, the path of a saved one, or None."""
    if obj is None or isinstance(obj, ActCalibration):
        return obj
    if isinstance(obj, (str, os.PathLike)):
        return ActCalibration.load(obj)
    raise TypeError(f"act_calib must be an ActCalibration or the path of an act_scales.json, got {type(obj).__name__}")


__all__ = ["ACT_METHODS", "ACT_MODES", "ActCalibration", "ActSpec", "DEFAULT_OUTLIERS", "DEFAULT_PREFIX", "SAVED_OUTLIERS",
           "calibrate_activations", "clipped_share", "from_stats", "hist_edges", "mse_clip", "range_mse", "resolve"]
