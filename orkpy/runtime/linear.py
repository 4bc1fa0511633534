"""One linear layer as the C forward model runs it: :class:`LinearSpec`, the seam between Python
and ``_core.ForwardModel`` (its one conversion to the C argument is :meth:`LinearSpec.to_core`;
csrc/ork/linear.h is the contract). :mod:`orkpy.runtime.model` builds a model's linears from these.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Tuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ..kernels.actspec import ActSpec
from ..kernels.packed import PackedWeight


@dataclass(frozen=True, eq=False)
class LinearSpec:
    """How one linear layer runs in the forward pass: ``path`` ``"f32"`` (``weight``, float32
    ``(N, K)``) or ``"packed"`` (``kind``, the tile ``store``, ``bscale`` float32 ``(N,)``; pack.h's
    layout) and the packed linear's activation spec ``act_spec`` (a resolved :class:`orkpy.ActSpec`:
    its mode, static range ``clip``, outlier ``channels`` and ``prefix``, the first rows of every
    call -- the sequence's first positions -- quantized per token; csrc/ork/actspec.h; None for
    a float linear); ``group``: group-wise scales (``bscale`` ``(N, G)``, csrc/ork/pack.h), 0 for
    per-channel ones. ``act`` (the mode name, ``"float"`` for a float linear), ``per_tensor_act``,
    ``act_clip``, ``outliers`` and ``act_prefix`` read the spec."""

    name: str
    path: str
    N: int
    K: int
    weight: Optional[NDArray[np.float32]] = None
    kind: Optional[str] = None
    store: Optional[NDArray[Any]] = None
    bscale: Optional[NDArray[np.float32]] = None
    act_spec: Optional[ActSpec] = None
    group: int = 0
    boffset: Optional[NDArray[np.float32]] = None  # affine groups' offsets (N, G), csrc/ork/affine.h

    def __post_init__(self) -> None:
        if self.path != "packed":
            return
        act = ActSpec() if self.act_spec is None else self.act_spec
        if not isinstance(act, ActSpec):
            raise TypeError(f"{self.name}: act_spec must be an ActSpec, got {type(act).__name__}")
        if not act.resolved:
            raise ValueError(f"{self.name}: the activation spec of mode {act.mode!r} is not resolved for one linear "
                             "(orkpy.runtime.actcal.resolve gives its range / channels)")
        try:
            act.check_width(self.K)
        except ValueError as e:
            raise ValueError(f"{self.name}: {e}") from None
        if act.channels is not None and self.group:
            raise ValueError(f"{self.name}: outlier channels are not supported with group-wise scales (group size "
                             f"{self.group}); use another activation mode")
        object.__setattr__(self, "act_spec", act)

    @property
    def act(self) -> str:
        """The activation mode (:data:`orkpy.ACT_MODES`; ``"float"`` for a float linear)."""
        return "float" if self.act_spec is None or self.path != "packed" else self.act_spec.mode

    act_mode = act  # the same, by the spec's own word

    @property
    def per_tensor_act(self) -> bool:
        """Whether one dynamic range spans a call's rows (the mode's registry row)."""
        return self.act_spec is not None and self.act_spec.info.per_tensor

    @property
    def act_clip(self) -> Optional[float]:
        """The static range (None for a dynamic mode or a float linear)."""
        return None if self.act_spec is None else self.act_spec.clip

    @property
    def outliers(self) -> Optional[NDArray[np.int32]]:
        """The outlier channels as int32 (None without)."""
        return None if self.act_spec is None else self.act_spec.outlier_array()

    @property
    def act_prefix(self) -> int:
        """The rows quantized per token (0 for a float linear)."""
        return 0 if self.act_spec is None else self.act_spec.prefix or 0

    @classmethod
    def f32(cls, name: str, w: ArrayLike) -> LinearSpec:
        """A float32 linear (C-contiguous float32 copy of ``w`` only when needed)."""
        a = np.ascontiguousarray(w, dtype=np.float32)
        return cls(name, "f32", int(a.shape[0]), int(a.shape[1]), weight=a)

    @classmethod
    def from_packed(cls, name: str, pw: PackedWeight, per_tensor_act: bool = False, act_clip: Optional[float] = None,
                    outliers: Optional[ArrayLike] = None, act_prefix: int = 0, *,
                    act_spec: Optional[ActSpec] = None) -> LinearSpec:
        """A packed linear running ``pw`` in the resolved activation spec ``act_spec`` (default per
        token), or in the one the keywords describe (``act_clip``: static; ``outliers``:
        per_token_outliers; ``per_tensor_act``: per_tensor; ``act_prefix``); ValueError naming the
        linear for a range that is not a finite float32 >= 1e-30 or channels that are not strictly
        increasing in ``[0, K)``."""
        legacy = per_tensor_act or act_clip is not None or outliers is not None or act_prefix != 0
        if act_spec is not None and legacy:
            raise ValueError(f"{name}: pass the activation settings in act_spec= (an ActSpec) or as keywords, not both")
        if act_spec is None:
            try:
                act_spec = ActSpec.from_keywords(per_tensor_act, act_clip, outliers, act_prefix)
            except ValueError as e:
                raise ValueError(f"{name}: {e}") from None
        return cls(name, "packed", pw.N, pw.K, kind=pw.kind, store=pw.store, bscale=pw.bscale, act_spec=act_spec,
                   group=pw.group, boffset=pw.boffset)

    def to_core(self) -> Tuple[str, Any]:
        """The argument ``_core.ForwardModel`` takes for this linear (the only place that knows it):
        ``("f32", weight)`` or ``("packed", {kind, store, bscale, N, K, group, act})``, ``act`` the
        activation spec's :meth:`ActSpec.to_core`."""
        if self.path == "f32":
            return ("f32", self.weight)
        if self.path == "packed":
            act = self.act_spec if self.act_spec is not None else ActSpec()
            d = {"kind": self.kind, "store": self.store, "bscale": self.bscale, "N": self.N, "K": self.K,
                 "group": self.group, "act": act.to_core()}
            if self.boffset is not None:  # affine groups (csrc/ork/affine.h)
                d["boffset"] = self.boffset
            return ("packed", d)
        raise ValueError(f"{self.name}: unknown linear path {self.path!r} (expected 'f32' or 'packed')")

    def packed_weight(self) -> PackedWeight:
        """The PackedWeight of a packed linear (for an NPU upload); ValueError for a float one."""
        if self.path != "packed" or self.kind is None or self.store is None or self.bscale is None:
            raise ValueError(f"{self.name} is a float linear, not a packed one")
        return PackedWeight(self.kind, (self.N, self.K), self.store, self.bscale, group=self.group, boffset=self.boffset)
