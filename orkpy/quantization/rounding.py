"""How a run goes and one linear's rounding, shared by the pipeline's stages (:mod:`orkpy.quantization.pipeline`) and
the layer-by-layer run (:mod:`orkpy.quantization.layerwise`): its plan, the rounded result, its
importance (the imatrix, AWQ-rescaled) and the rounding call."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Optional

import numpy as np
from numpy.typing import NDArray

from ..kernels.packed import PackedWeight
from ..kernels.quant import KIND_INFO, QuantizedTensor, quantize
from .recipe import RoundingSpec

if TYPE_CHECKING:
    from .imatrix import Imatrix


class RunOptions(NamedTuple):
    """How a run goes, never what it makes: threads, progress bars, the log."""

    threads: Optional[int]
    progress: bool
    log: Callable[[str], None]


class LinearPlan(NamedTuple):
    """One linear's tier as saved (a default group size applied), its quantizer kind ("gguf": it
    stays float) and its group size (None: one scale per output channel)."""

    tier: str
    kind: str
    group: Optional[int]


class Rounded(NamedTuple):
    """One linear out of :func:`round_linears`: its packed weight (None: it stays float), and
    ``streamed``: rounded here one at a time (its source pages can go back once it is written),
    not taken from GPTQ's results."""

    name: str
    tier: str
    packed: Optional[PackedWeight]
    streamed: bool


def importance(imatrix: Optional["Imatrix"], name: str, columns: Optional[NDArray[Any]],
               K: int) -> Optional[NDArray[Any]]:
    """The imatrix values of linear ``name`` (None without), divided by AWQ's column scales
    squared when the inputs were scaled; ValueError if they do not fit ``K`` inputs."""
    im = imatrix.values(name) if (imatrix is not None and name in imatrix) else None
    if im is not None and columns is not None and im.shape == columns.shape:
        im = (np.asarray(im, np.float64) / columns ** 2).astype(np.float32)  # the scaled inputs' importance
    if im is not None and im.shape != (K,):
        where = f"{imatrix.path}: " if imatrix is not None and imatrix.path else ""
        raise ValueError(f"{where}the imatrix entry for {name!r} has {im.size} values but the tensor has "
                         f"K = {K} input columns: the imatrix is for a different model")
    return im


def symmetric_for(kind: str, group: Optional[int], K: int, rounding: RoundingSpec) -> bool:
    """Whether a linear of ``kind`` with group size ``group`` keeps symmetric scales: always, unless
    ``rounding.symmetric`` is False and it is a group-wise weight of the NPU's int4 kinds (w4a4, w4a8),
    which then takes affine groups (csrc/ork/affine.h)."""
    if rounding.symmetric or kind not in KIND_INFO:
        return True
    ki = KIND_INFO[kind]
    return not (ki.bits == 8 and ki.qmax == 7 and group and group < K)


def round_linear(w: NDArray[Any], p: LinearPlan, rounding: RoundingSpec, im: Optional[NDArray[Any]],
                 threads: Optional[int]) -> QuantizedTensor:
    """One linear's weight rounded (:func:`orkpy.quantize`) as ``rounding`` says."""
    sym = symmetric_for(p.kind, p.group, int(w.shape[1]), rounding)
    return quantize(w, p.kind, imatrix=im, sr=rounding.sr, seed=rounding.seed, clip_grid=rounding.clip_grid,
                    threads=threads, group_size=p.group, search=rounding.clip_search, symmetric=sym)


__all__ = ["LinearPlan", "Rounded", "RunOptions", "importance", "round_linear", "symmetric_for"]
