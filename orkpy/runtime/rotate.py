"""Computational invariance: a model rewritten so that it computes the same function in
float while its activations lose their outlier channels (QuaRot-style rotations folded into
the weights), and SmoothQuant-style migration of activation outliers into the weights.

:func:`rotate_source` ``(src, rotate="hadamard", seed=0, heads=True, smooth=None, stats=None,
online=False, placement=None)``
returns a :class:`TransformedSource`: a :class:`~orkpy.formats.source.Source` whose tensors are the
transformed ones, computed per tensor when asked for (nothing is held but the transformation
matrices and, once computed, the embedding table), with the wrapped source's
hyper-parameters, metadata and tokenizer. ``load_model``, ``quantize_model``, tier maps (by
tensor name) and model directories work on it unchanged; the fp16/F32 source stays the
source of truth. Row vectors throughout: a linear ``W`` (N, K) computes ``y = x W^T + b``.

Rotation (``rotate="hadamard"``), placement "fold" (the default of every architecture whose
residual stream only passes through pre-norms and whose head may be untied: ``not post_norms and
not always_tied`` in :mod:`orkpy.arch`, i.e. llama, qwen2, qwen3, phi3):

- each RMSNorm weight ``g`` in front of linears is folded into them (``W diag(g)``) and
  becomes ones; RMSNorm without a weight commutes with an orthogonal ``Q``
  (``rms(x Q) = rms(x)``, epsilon included);
- the residual stream is ``x Q``: the embedding becomes ``E Q``; every input-side linear
  (``attn_q/k/v``, ``ffn_gate/up``, the head) ``W diag(g) Q``; every output-side linear
  (``attn_output``, ``ffn_down``) ``Q^T W`` and its bias ``b Q``; input-side biases and
  ``output.bias`` are unchanged. A tied head becomes an untied one
  (``E diag(g_out) Q`` differs from the embedding ``E Q``): the source has an
  ``output.weight`` and ``tied`` is False;
- ``heads=True`` also rotates each attention head's values by an ``hd x hd`` Hadamard
  ``R`` (exact offline: attention mixes positions, not channels): ``attn_v``'s rows of each
  KV head ``R^T V_j`` (its bias too), ``attn_output``'s columns of each query head ``W R``.
  That spreads the outliers of ``attn_output``'s input as ``Q`` does the residual's.

Online rotation of ``ffn_down``'s input (``online=True``; any architecture, Gemma included:
it stays inside the FFN): ``act(gate) * up`` passes a nonlinearity, so no offline fold
reaches it; the forward pass multiplies each token's ``n_ff`` values by
``H / sqrt(n_ff)``, ``H = kron(H_p, H_m)`` (:func:`hadamard`), as a fast Walsh-Hadamard
transform of the ``p`` blocks of ``m = n_ff / p`` values and a ``p x p`` mix of the blocks
(csrc/ork/model.c ``down_rotate``, the block from :func:`down_rot_block`), and
``ffn_down`` becomes ``W diag(signs) H / sqrt(n_ff)`` with the random signs (``seed``)
folded into ``ffn_up``'s rows and bias. Cost per token: ``n_ff log2(m)`` additions and
``n_ff p`` multiply-adds on the host, against ``n_embd n_ff`` for ``ffn_down`` itself:
SmolLM2 (1536 = 12 x 128) 10.8k + 18.4k = 29k vs 885k, 3.3% of ``ffn_down``'s
multiply-adds, about 1% of the layer's; run on the CPU, single-threaded, between the
FFN's two halves (on the NPU it is a host round trip unless the NPU does it). The source's
``hp`` says ``ffn_down_rot``; a model directory's manifest records it and loading re-applies
it; the fused FFN chain refuses such a layer.

``Q = diag(signs) H / sqrt(D)`` with random signs (``seed``) and ``H`` a Hadamard matrix of
order D built as Kronecker products of a Paley block and a Sylvester power of two
(:func:`hadamard`: order ``2^k * p`` with ``p = 1``, ``p = q + 1`` for a prime ``q = 3 mod 4``
(Paley I) or ``p = 2 (q + 1)`` for a prime ``q = 1 mod 4`` (Paley II)): 576 (SmolLM2) =
36 x 16 (Paley II, q = 17), 640 (Gemma 3) = 20 x 32 (Paley I, q = 19), 64 = Sylvester. An
order none of these reach gets a random orthogonal matrix (QR of a Gaussian, ``seed``) and
``info()["construction"]`` says so; ``rotate="orthogonal"`` asks for one always.

Gemma 2/3 cannot fold ``Q`` into the residual stream (placement "fold" raises
NotImplementedError): their post-attention / post-FFN norms normalize a block's output and
multiply it elementwise by a weight *before* it joins the residual stream; ``rms(o) diag(g)``
followed by ``Q`` cannot be folded into ``attn_output`` / ``ffn_down`` (the norm would see the
rotated, scaled output and its weight does not commute with ``Q``). Gemma 1 folds exactly, but
its head must stay tied (``always_tied``: llama.cpp never loads an ``output.weight`` for it, and
orkpy refuses one, a saved model directory's ``float.gguf`` included), and a fold unties it
(above); "fold" is refused there too. Their default placement is "online" (any architecture may
ask for it with ``placement="online"``): the residual stream stays as it is, and the *outputs*
of ``attn_norm`` and ``ffn_norm`` -- the inputs of ``attn_q/k/v`` and ``ffn_gate/up``, the only
places the residual stream meets a quantized matmul -- are multiplied online by ``H / sqrt(D)``
(``D = n_embd``, the same fast Walsh-Hadamard + ``p x p`` block as the down rotation; model.h
``norm_rot``), with the random signs folded into the norm weights (``g * signs``) and the input
linears ``W diag(signs) H / sqrt(D)``; the per-head V/O rotation (``heads``) is offline as
above. The head (fed by ``output_norm``) stays unrotated and tied. Cost per token and layer: two
transforms of ``D`` values, ``2 D (log2(m) + p)``: Gemma 3-270M (640 = 20 x 32) 32k
multiply-adds against 5.6M for the layer's linears (0.6%), on the host between the norm and the
matmuls -- where the host already is on the NPU, since it computes the norm. Smoothing's norm
groups have no weight to fold into there (the rotation comes after the norm) and are left out;
the ``attn_v`` -> ``attn_output`` and ``ffn_up`` -> ``ffn_down`` pairs still apply. A model
directory's manifest records the placement and loading re-applies it.

SmoothQuant (``smooth=alpha``, with ``stats``): per-channel scales
``s_j = a_j^alpha / w_j^(1 - alpha)`` (``a_j``: the RMS of the linear's input channel j on
calibration text, ``sqrt(sum x^2 / count)`` from :meth:`orkpy.Model.collect_activation_stats`,
in place of SmoothQuant's absmax, which the forward pass does not collect; ``w_j``: the
largest ``|W_ij|`` of the consumers' column j) divide the activations and multiply the
weights, each pair folded where it is exact:

- a pre-norm and its consumers: norm weight ``g / s``, ``W diag(s)`` (``attn_norm`` ->
  q, k, v; ``ffn_norm`` -> gate, up; ``output_norm`` -> the head, except for an
  always-tied architecture, Gemma 2, whose head stays the embedding);
- ``attn_v`` -> ``attn_output`` (attention is linear in V per channel): ``attn_v`` rows and
  bias ``/ s``, ``attn_output`` columns ``* s`` (each query head's columns take its KV
  head's scales);
- ``ffn_up`` -> ``ffn_down`` (``act(gate) * up`` is linear in ``up`` per channel): ``ffn_up``
  rows and bias ``/ s``, ``ffn_down`` columns ``* s`` (not with ``online``: the input is
  rotated there).

With a rotation, smoothing happens after it, in the rotated basis (folded norms are ones,
so the norm weight becomes ``1 / s``); ``stats`` must then come from the rotated model
(``rotate_source(src, rotate, seed, heads)`` run in float), which
``orkpy.load_model(..., rotate=, smooth=, calib=)`` and ``quantize_model`` do. (Smoothing
before a rotation would be undone by the norm folding.)

The transformed tensors are computed in float64 and stored float32 (a randomized Hadamard
rotation as a fast transform, :mod:`orkpy.runtime.hadamard`: ``O(n log n)`` per row rather than a
dense product); their stored type
(:meth:`TransformedSource.type_of`) is F32 (or the source's quantized type, so
``quantize_model`` still reports a double quant).
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
from numpy.typing import NDArray

from ..formats import arch as _arch
from ..formats.source import FLOAT_TYPES, Source
from ..formats.tiermap import EMBEDDING, OUTPUT
from .hadamard import FastRotation, fast_of, hadamard, hadamard_factors, paley, right_product

#: rotation kinds: "hadamard" (randomized Hadamard, random orthogonal where no Hadamard is
#: built for the order) and "orthogonal" (random orthogonal always)
ROTATIONS = ("hadamard", "orthogonal")

_ROW_BLOCK = 16384  # rows of a big tensor (the embedding) transformed at a time, float64
_BLOCK_BYTES = 64 << 20  # float64 bytes of a linear's weight transformed at a time (TransformedSource._blocks)

# ------------------------------------------------------------ Hadamard --

def rotation(n: int, kind: str = "hadamard", seed: int = 0) -> Tuple[NDArray[np.float64], str]:
    """(an orthogonal n x n float64 matrix, how it was built). ``"hadamard"``:
    ``diag(signs) H / sqrt(n)`` with random signs from ``seed``, or a random orthogonal
    matrix when :func:`hadamard` builds none for n; ``"orthogonal"``: a random orthogonal
    matrix (QR of a standard Gaussian, the signs of R's diagonal moved into Q)."""
    if kind not in ROTATIONS:
        raise ValueError(f"rotate must be one of {', '.join(ROTATIONS)} (or None), got {kind!r}")
    rng = np.random.default_rng(seed)
    if kind == "hadamard":
        h = hadamard(n)
        if h is not None:
            p, two = hadamard_factors(n)  # type: ignore[misc]
            signs = rng.choice(np.array([-1.0, 1.0]), n)
            how = f"randomized Hadamard {n} = " + (f"Paley {p} x " if p > 1 else "") + f"Sylvester {two}"
            return signs[:, None] * h / np.sqrt(n), how
    q, r = np.linalg.qr(rng.standard_normal((n, n)))
    q *= np.sign(np.diag(r))[None, :]
    return q, f"random orthogonal {n} (QR of a Gaussian" + (", no Hadamard built for this order)"
                                                           if kind == "hadamard" else ")")


# ----------------------------------------------------------- the source --

#: input-side linear stem -> the stem of the norm that feeds it
_IN_GROUPS = {"attn_q": "attn_norm", "attn_k": "attn_norm", "attn_v": "attn_norm", "ffn_gate": "ffn_norm",
              "ffn_up": "ffn_norm"}
_OUT_LINEARS = ("attn_output", "ffn_down")
OUTPUT_NORM = _arch.OUTPUT_NORM


def _split(name: str) -> Tuple[Optional[int], str]:
    """(block index, ``<stem>.<kind>``) of ``blk.<i>.<stem>.<kind>``; (None, name) otherwise."""
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit():
        return int(parts[1]), parts[2]
    return None, name


def _pair(i: int, producer: str) -> str:
    """The smoothing group key of a producer -> consumer pair (``attn_v`` or ``ffn_up`` of block i)."""
    return f"blk.{i}.{producer}>"


class TransformedSource(Source):
    """A source whose tensors are rotated and/or smoothed (:func:`rotate_source`); ``base``
    is the wrapped source, :meth:`info` what was done (recorded in a model directory's
    manifest). ``scales``: smoothing group -> scales; a group is a norm tensor's name
    (``blk.<i>.attn_norm.weight``, ``blk.<i>.ffn_norm.weight``, ``output_norm.weight``) or a
    pair ``blk.<i>.attn_v>`` / ``blk.<i>.ffn_up>`` (:func:`_pair`)."""

    def __init__(self, base: Source, q: Optional[NDArray[np.float64]], head_rot: Optional[NDArray[np.float64]],
                 scales: Mapping[str, NDArray[np.float64]], info: Dict[str, Any],
                 online: Optional[Tuple[NDArray[np.float64], NDArray[np.float64]]] = None,
                 norm_online: Optional[Tuple[NDArray[np.float64], NDArray[np.float64]]] = None) -> None:
        self.base = base
        self.path = base.path
        self.hp = dict(base.hp)
        if online is not None:
            self.hp["ffn_down_rot"] = True
        if norm_online is not None:
            self.hp["norm_rot"] = True
        self._online = online  # (signs (n_ff,), kron(H_p, H_m) / sqrt(n_ff)): ffn_down's online rotation
        self._nrot = norm_online  # (signs (n_embd,), kron(H_p, H_m) / sqrt(n_embd)): the block inputs' one
        self.meta = base.meta
        self._q = q
        self._qf = fast_of(q)  # the same products, O(n log n) per row
        self._nrotf = None if norm_online is None else fast_of(norm_online[1])
        self._onlinef = None if online is None else fast_of(online[1])
        self._r = head_rot
        self._rf = fast_of(head_rot)
        self._s = dict(scales)
        self._info = dict(info)
        self._shapes = base.shapes()
        self.tied = base.tied and not (q is not None or OUTPUT_NORM in self._s)
        if base.tied and not self.tied:
            self._shapes[OUTPUT] = self._shapes[EMBEDDING]
        self._changed = self._changed_names()
        self._emb: Optional[NDArray[np.float32]] = None

    def release(self, caches: bool = True) -> None:
        self.base.release(caches)

    def _changed_names(self) -> set:
        """The tensors that differ from the wrapped source's."""
        out = set()
        lin = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
        for i in range(self.hp["n_layer"]):
            p = f"blk.{i}."
            if self._q is not None:
                out |= {f"{p}{t}.weight" for t in lin + ("attn_norm", "ffn_norm")}
                out |= {f"{p}{t}.bias" for t in _OUT_LINEARS}
            if self._r is not None:
                out |= {p + "attn_v.weight", p + "attn_v.bias", p + "attn_output.weight"}
            if self._online is not None:
                out |= {p + "ffn_up.weight", p + "ffn_up.bias", p + "ffn_down.weight"}
            if self._nrot is not None:
                out |= {f"{p}{t}.weight" for t in tuple(_IN_GROUPS) + ("attn_norm", "ffn_norm")}
            for norm in ("attn_norm", "ffn_norm"):
                if f"{p}{norm}.weight" in self._s:
                    out.add(f"{p}{norm}.weight")
                    out |= {f"{p}{t}.weight" for t, n in _IN_GROUPS.items() if n == norm}
            for prod, cons in (("attn_v", "attn_output"), ("ffn_up", "ffn_down")):
                if _pair(i, prod) in self._s:
                    out |= {f"{p}{prod}.weight", f"{p}{prod}.bias", f"{p}{cons}.weight"}
        if self._q is not None:
            out |= {EMBEDDING, OUTPUT, OUTPUT_NORM}
        if OUTPUT_NORM in self._s:
            out |= {OUTPUT, OUTPUT_NORM}
        return out & set(self._shapes)

    def with_scales(self, scales: Mapping[str, NDArray[np.float64]], info: Mapping[str, Any]) -> "TransformedSource":
        """The same rotation with these scales folded in (AWQ, :mod:`orkpy.quantization.awq`) and ``info`` added
        to :meth:`info`; ValueError when this source already folds scales (smoothing)."""
        if self._s:
            raise ValueError(f"{self.path}: already smoothed (smooth=); AWQ scales fold into the same places")
        return TransformedSource(self.base, self._q, self._r, scales, dict(self._info, **info), self._online,
                                 self._nrot)

    def info(self) -> Dict[str, Any]:
        """{rotate, seed, heads, smooth, construction, ...}: what the transformation is."""
        return dict(self._info)

    def shapes(self) -> Dict[str, Tuple[int, ...]]:
        return dict(self._shapes)

    def transformed(self, name: str) -> bool:
        """Whether tensor ``name`` differs from the wrapped source's."""
        return name in self._changed

    def type_of(self, name: str) -> str:
        t = self.base.type_of(self.base.tensor_name(name))
        return "F32" if (t in FLOAT_TYPES and name in self._changed) else t

    def tensor(self, name: str) -> NDArray[np.float32]:
        if name not in self._shapes:
            raise KeyError(f"{self.path}: no tensor named {name!r}")
        if name not in self._changed:
            return self.base.tensor(name)
        if name == EMBEDDING:
            if self._emb is None:
                self._emb = _right(self.base.tensor(EMBEDDING), self._q, self._qf)
            return self._emb
        how = self._blocks(name)
        if how is None:
            return np.ascontiguousarray(self._compute(name), dtype=np.float32)
        axis, step = how
        out = np.empty(self._shapes[name], np.float32)
        raw: Optional[NDArray[Any]] = None
        if axis == 1:  # the stored float16 when the file holds it (no float32 copy of the whole tensor)
            raw = self.base.linear_stored(name)
            raw = self.base.tensor(name) if raw is None else raw
        for b in range(0, out.shape[axis], step):  # every row (column) computed as in the whole tensor
            sl = slice(b, min(out.shape[axis], b + step))
            if axis == 0:
                out[sl] = self._compute(name, rows=sl)
            else:
                out[:, sl] = self._compute(name, cols=sl, raw=raw)
        return out

    def _blocks(self, name: str) -> Optional[Tuple[int, int]]:
        """(axis, step): a block linear's weight larger than :data:`_BLOCK_BYTES` in float64 computed a
        block of rows (axis 0: the input-side linears, whose transforms act on each row) or of columns
        (axis 1: ``attn_output`` / ``ffn_down``, whose ``Q^T`` mixes rows, unless ``ffn_down``'s input is
        rotated online) at a time, blocks of whole heads; None: the whole tensor at once."""
        i, rest = _split(name)
        if i is None or not rest.endswith(".weight") or len(self._shapes[name]) != 2:
            return None
        stem = rest.rsplit(".", 1)[0]
        N, K = self._shapes[name]
        if 8 * N * K <= _BLOCK_BYTES:
            return None
        hd = int(self.hp.get("head_dim") or 1)
        if stem in _IN_GROUPS:
            return 0, max(hd, _BLOCK_BYTES // (8 * K) // hd * hd)
        if stem == "attn_output" or (stem == "ffn_down" and self._online is None):
            return 1, max(hd, _BLOCK_BYTES // (8 * N) // hd * hd)
        return None

    def rows(self, name: str, ids: Union[slice, NDArray[Any]]) -> NDArray[np.float32]:
        if name == EMBEDDING and name in self._changed and self._emb is None:
            return _right(self.base.rows(EMBEDDING, ids), self._q, self._qf)
        if name == OUTPUT and name in self._changed:
            return np.ascontiguousarray(self._input_side(self.base.rows(OUTPUT, ids), OUTPUT_NORM), np.float32)
        if name not in self._changed and name != EMBEDDING:
            return self.base.rows(name, ids)
        return super().rows(name, ids)

    # -- one tensor, in float64 --
    def _input_side(self, w: NDArray[Any], norm: str) -> NDArray[np.float64]:
        """``W diag(g) Q diag(s)`` (rotating), ``W diag(signs) H`` (rotated online after the
        norm) or ``W diag(s)`` of a linear fed by the norm ``norm``."""
        if self._q is not None:
            w = right_product(w, self._q, self._qf, np.asarray(self.base.tensor(norm), np.float64))
        elif self._nrot is not None and norm != OUTPUT_NORM:
            w = right_product(w, self._nrot[1], self._nrotf, self._nrot[0])
        else:
            w = np.array(w, np.float64)  # a copy of its own: scaled in place below
        s = self._s.get(norm)
        if s is not None:
            w *= s[None, :]  # in place: the transforms above made a new array (one float64 copy at a time)
        return w

    def _compute(self, name: str, rows: Optional[slice] = None, cols: Optional[slice] = None,
                 raw: Optional[NDArray[Any]] = None) -> NDArray[Any]:
        """Tensor ``name`` in float64; of a block linear's weight only ``rows`` (input side) or
        ``cols`` (``raw``: the whole stored tensor) when given (:meth:`_blocks`)."""
        if name == OUTPUT:
            return self._input_side(self.base.linear(OUTPUT), OUTPUT_NORM)
        if rows is not None:
            raw = self.base.rows(name, rows)
        elif raw is None:
            raw = self.base.tensor(name)
        if cols is not None:
            raw = raw[:, cols]
        a: NDArray[Any]
        i, rest = _split(name)
        if i is not None and rest.endswith(".weight") and rest.rsplit(".", 1)[0] in _IN_GROUPS:
            a = raw  # float32: _input_side makes the one float64 copy
        else:
            a = np.array(raw, np.float64)  # this tensor's own float64 copy (changed in place below)
        del raw
        if name == OUTPUT_NORM or name.endswith(("attn_norm.weight", "ffn_norm.weight")):
            g = np.ones_like(a) if self._q is not None else a
            if self._nrot is not None and name != OUTPUT_NORM:  # the online rotation's random signs
                g = g * self._nrot[0]
            s = self._s.get(name)
            return g / s if s is not None else g
        assert i is not None
        stem, kind = rest.rsplit(".", 1)
        p = f"blk.{i}."
        if stem in _IN_GROUPS and kind == "weight":
            a = self._input_side(a, f"{p}{_IN_GROUPS[stem]}.weight")
        if stem == "attn_v":
            if self._r is not None:  # per KV head: R^T V_j (rows; a bias alike)
                hd = self.hp["head_dim"]
                if self._rf is None:
                    a = np.einsum("cd,jc...->jd...", self._r, a.reshape(-1, hd, *a.shape[1:])).reshape(a.shape)
                elif a.ndim == 1:
                    a = self._rf.right(a.reshape(-1, hd)).reshape(a.shape)
                else:  # each head's (hd, K) block: R^T V_j = (V_j^T R)^T
                    K = a.shape[1]
                    t = np.ascontiguousarray(a.reshape(-1, hd, K).transpose(0, 2, 1)).reshape(-1, hd)
                    a = np.ascontiguousarray(self._rf.right(t).reshape(-1, K, hd).transpose(0, 2, 1)).reshape(a.shape)
            return _div_rows(a, _part(self._s.get(_pair(i, "attn_v")), rows))
        if stem == "ffn_up":
            if self._online is not None:  # the random signs of the online rotation
                sg = self._online[0] if rows is None else self._online[0][rows]
                a *= sg[:, None] if a.ndim == 2 else sg
            return _div_rows(a, _part(self._s.get(_pair(i, "ffn_up")), rows))
        if stem in _OUT_LINEARS:
            if kind == "weight":
                a = self._out_columns(a, i, stem, cols)
            if self._q is None:
                return a
            return self._qf.left_t(a) if self._qf is not None else self._q.T @ a
        return a

    def _out_columns(self, w: NDArray[Any], i: int, stem: str, cols: Optional[slice] = None
                     ) -> NDArray[Any]:
        """attn_output: each query head's columns ``W_h R``, times its KV head's scales;
        ffn_down: columns times the up scales (``w`` is the caller's own float64 copy: scaled in place)."""
        if stem == "ffn_down":
            s = _part(self._s.get(_pair(i, "ffn_up")), cols)
            if s is not None:
                w *= s[None, :]
            if self._online is not None:  # W diag(signs) H / sqrt(n_ff): the input arrives rotated online
                w = right_product(w, self._online[1], self._onlinef, self._online[0])
            return w
        hd, nh, nkv = self.hp["head_dim"], self.hp["n_head"], self.hp["n_head_kv"]
        if self._r is not None and self._rf is not None:
            w = self._rf.right(w.reshape(-1, hd)).reshape(w.shape)
        elif self._r is not None:
            w = np.einsum("nhc,cd->nhd", w.reshape(w.shape[0], -1, hd), self._r).reshape(w.shape)
        s = self._s.get(_pair(i, "attn_v"))
        if s is not None:
            w *= np.repeat(s.reshape(nkv, 1, hd), nh // nkv, axis=1).reshape(-1)[None, cols if cols is not None else slice(None)]
        return w


def _part(v: Optional[NDArray[Any]], sl: Optional[slice]) -> Optional[NDArray[Any]]:
    """``v[sl]`` (None stays None; no slice: all of it)."""
    return v if (v is None or sl is None) else v[sl]


def _div_rows(a: NDArray[Any], s: Optional[NDArray[Any]]) -> NDArray[Any]:
    """Rows (or a bias's entries) of ``a`` (the caller's own float64 array) divided by ``s``."""
    if s is None:
        return a
    a /= s[:, None] if a.ndim == 2 else s  # in place: ``a`` is the caller's own copy
    return a


def _right(a: NDArray[Any], m: Optional[NDArray[np.float64]], fast: Optional[FastRotation] = None) -> NDArray[np.float32]:
    """float32 ``a @ m`` computed in float64, a block of rows at a time (``fast``: :func:`fast_of` ``m``)."""
    if m is None:
        return np.asarray(a, np.float32)
    out = np.empty(a.shape, np.float32)
    for r in range(0, a.shape[0], _ROW_BLOCK):
        out[r:r + _ROW_BLOCK] = right_product(a[r:r + _ROW_BLOCK], m, fast)
    return out


# ----------------------------------------------------------- smoothing --

Stats = Mapping[str, Any]


def _rms(stats: Stats, name: str) -> NDArray[np.float64]:
    """Per-channel RMS of a linear's input: stats[name] is (sum x^2, count) or E[x^2]."""
    if name not in stats:
        raise ValueError(f"smoothing needs activation statistics for {name!r} (collect them on the rotated "
                         "model: Model.collect_activation_stats)")
    v = stats[name]
    if isinstance(v, tuple):
        sums, count = v
        ms = np.asarray(sums, np.float64) / max(int(count), 1)
    else:
        ms = np.asarray(getattr(v, "values", v), np.float64)
    return np.sqrt(np.maximum(ms, 0.0))


def smooth_scales(act_rms: NDArray[Any], wmax: NDArray[Any], alpha: float) -> NDArray[np.float64]:
    """SmoothQuant's ``s = a^alpha / w^(1 - alpha)`` per channel (1 where either is 0)."""
    a, w = np.asarray(act_rms, np.float64), np.asarray(wmax, np.float64)
    ok = (a > 0) & (w > 0)
    s = np.ones_like(a)
    s[ok] = a[ok] ** alpha / w[ok] ** (1.0 - alpha)
    return s


def _colmax(ws: Sequence[NDArray[Any]]) -> NDArray[np.float64]:
    return np.max([np.abs(np.asarray(w)).max(axis=0) for w in ws], axis=0).astype(np.float64)


def _smoothing(src: Source, alpha: float, stats: Stats) -> Dict[str, NDArray[np.float64]]:
    """The smoothing scales of every group of ``src`` (already rotated, unsmoothed); not the
    ``ffn_up`` -> ``ffn_down`` pair when ``ffn_down``'s input is rotated online, nor the
    norm groups when the block inputs are (placement "online")."""
    hp = src.hp
    a = _arch.get(hp["arch"])
    out: Dict[str, NDArray[np.float64]] = {}
    hd, nh, nkv = hp["head_dim"], hp["n_head"], hp["n_head_kv"]
    for i in range(hp["n_layer"]):
        p = f"blk.{i}."
        for group, stems in (("attn_norm", ("attn_q", "attn_k", "attn_v")), ("ffn_norm", ("ffn_gate", "ffn_up"))):
            if hp.get("norm_rot"):
                continue  # the inputs are rotated online after the norm: no weight to fold a scale into
            ws = [src.linear(f"{p}{t}.weight") for t in stems]
            out[f"{p}{group}.weight"] = smooth_scales(_rms(stats, f"{p}{stems[0]}.weight"), _colmax(ws), alpha)
        # attn_v -> attn_output: the KV channel's scale serves every query head of its group
        act = _rms(stats, f"{p}attn_output.weight").reshape(nkv, nh // nkv, hd).max(axis=1)
        wo = np.abs(src.linear(f"{p}attn_output.weight")).max(axis=0).reshape(nkv, nh // nkv, hd).max(axis=1)
        out[_pair(i, "attn_v")] = smooth_scales(act, wo, alpha).reshape(-1)
        if not hp.get("ffn_down_rot"):
            out[_pair(i, "ffn_up")] = smooth_scales(
                _rms(stats, f"{p}ffn_down.weight"), _colmax([src.linear(f"{p}ffn_down.weight")]), alpha)
    if not a.always_tied:
        out[OUTPUT_NORM] = smooth_scales(_rms(stats, OUTPUT), _colmax([src.linear(OUTPUT)]), alpha)
    return out


# ---------------------------------------------------------------- entry --

#: where a rotation of the block inputs goes: folded into the weights, or applied online
PLACEMENTS = ("fold", "online")


def rotate_source(src: Source, rotate: Optional[str] = "hadamard", seed: int = 0, heads: bool = True,
                  smooth: Optional[float] = None, stats: Optional[Stats] = None,
                  calib_info: Optional[Mapping[str, Any]] = None, online: bool = False,
                  placement: Optional[str] = None) -> Source:
    """``src`` rotated (``rotate``: "hadamard", "orthogonal" or None), with ``ffn_down``'s input
    rotated online (``online``) and/or smoothed (``smooth``: SmoothQuant's alpha in (0, 1],
    with ``stats`` = {linear name: (sum x^2, count)} of the *rotated, unsmoothed* model on
    calibration text; ``calib_info``: how they were collected, kept in ``info()["calib"]``);
    ``placement``: where the rotation ``Q`` lives, "fold" (the residual stream, folded into
    every weight) or "online" (the outputs of attn_norm / ffn_norm rotated online, the input
    linears folded); None: "fold" where exact, "online" on Gemma 2/3, whose post-norms keep a
    rotation out of the residual stream, and on Gemma 1, whose head must stay tied ("fold" is
    refused on all three). See the module doc. With none of them, ``src`` itself."""
    if rotate is None and smooth is None and not online:
        return src
    if isinstance(src, TransformedSource):
        raise ValueError(f"{src.path}: already transformed ({src.info()}); transform the original source")
    hp = src.hp
    a = _arch.get(hp["arch"])
    info: Dict[str, Any] = {"rotate": rotate, "seed": int(seed) if rotate is not None else None,
                            "heads": bool(heads) if rotate is not None else None,
                            "smooth": None if smooth is None else float(smooth), "online": bool(online)}
    q = r = nrot = None
    if placement is not None and placement not in PLACEMENTS:
        raise ValueError(f"placement must be {' or '.join(repr(p) for p in PLACEMENTS)}, got {placement!r}")
    if rotate is not None:
        if placement is None:
            placement = "online" if (a.post_norms or a.always_tied) else "fold"
        info["placement"] = placement
    if rotate is not None and placement == "online":
        f = hadamard_factors(hp["n_embd"])
        if rotate != "hadamard" or f is None or f[0] > 256:
            raise ValueError(f"{src.path}: an online rotation of the block inputs needs a Hadamard matrix of order "
                             f"n_embd = {hp['n_embd']} (p * 2^k with a Paley order p <= 256; see "
                             "orkpy.runtime.rotate.hadamard) and rotate='hadamard'")
        d = hp["n_embd"]
        signs = np.random.default_rng(seed).choice(np.array([-1.0, 1.0]), d)
        h = hadamard(d)
        assert h is not None  # hadamard_factors(d) succeeded
        nrot = (signs, h / np.sqrt(d))
        info["construction"] = f"Hadamard {d} = " + (f"Paley {f[0]} x " if f[0] > 1 else "") + f"Sylvester {f[1]}"
        if heads:
            r, info["head_construction"] = rotation(hp["head_dim"], rotate, seed + 1)
    elif rotate is not None:
        if a.post_norms:
            raise NotImplementedError(
                f"{src.path}: rotating the residual stream of a {hp['arch']} model is not exact: its post-attention / "
                "post-FFN norms (post_attention_norm, post_ffw_norm) normalize each block's output and scale it "
                "elementwise before it joins the residual stream, which does not commute with a rotation (an online "
                "rotation after each post norm would be needed). Use placement='online' (the default there), which "
                "rotates each block's inputs online after its norms.")
        if a.always_tied:
            raise NotImplementedError(
                f"{src.path}: rotating the residual stream of a {hp['arch']} model unties its head (the head becomes "
                f"E diag(g_out) Q, the embedding E Q), and a {hp['arch']} file never holds an output.weight (llama.cpp "
                "refuses one, and so does orkpy, a saved model directory included). Use placement='online' (the "
                "default there), which keeps the head tied.")
        q, info["construction"] = rotation(hp["n_embd"], rotate, seed)
        if heads:
            r, info["head_construction"] = rotation(hp["head_dim"], rotate, seed + 1)
    on = None
    if online:
        n_ff = hp["n_ff"]
        h = hadamard(n_ff)
        if h is None:
            raise ValueError(f"{src.path}: an online rotation of ffn_down's input needs a Hadamard matrix of order "
                             f"n_ff = {n_ff} (p * 2^k with a Paley order p; see orkpy.runtime.rotate.hadamard)")
        signs = np.random.default_rng(seed + 2).choice(np.array([-1.0, 1.0]), n_ff)
        on = (signs, h / np.sqrt(n_ff))
        p, two = hadamard_factors(n_ff)  # type: ignore[misc]
        info["online_construction"] = f"Hadamard {n_ff} = " + (f"Paley {p} x " if p > 1 else "") + f"Sylvester {two}"
    scales: Dict[str, NDArray[np.float64]] = {}
    if smooth is not None:
        if not (isinstance(smooth, (int, float)) and not isinstance(smooth, bool) and 0 < smooth <= 1):
            raise ValueError(f"smooth must be SmoothQuant's alpha in (0, 1], got {smooth!r}")
        if stats is None:
            raise ValueError("smooth= needs stats= (activation statistics of the rotated model on calibration text)")
        base = TransformedSource(src, q, r, {}, info, on, nrot) if (rotate is not None or on is not None) else src
        scales = _smoothing(base, float(smooth), stats)
        info["calib"] = None if calib_info is None else dict(calib_info)
    return TransformedSource(src, q, r, scales, info, on, nrot)


def down_rot_block(n_ff: int, what: str = "n_ff", use: str = "the online down rotation") -> NDArray[np.float32]:
    """The ``p x p`` block the forward pass takes for an online rotation of ``ffn_down``'s input
    (model.h ``down_rot``; of order n_embd: the block inputs' ``norm_rot``): ``H_p / sqrt(n)``,
    float32, for ``kron(H_p, H_m) / sqrt(n)`` (:func:`hadamard`) with the Sylvester ``H_m``
    applied as a fast Walsh-Hadamard transform."""
    n_ff = int(n_ff)
    f = hadamard_factors(n_ff)
    if f is None:
        raise ValueError(f"no Hadamard matrix of order {what} = {n_ff} for {use}")
    p = f[0]
    hp = paley(p) if p > 1 else np.ones((1, 1))
    assert hp is not None
    return np.ascontiguousarray(hp / np.sqrt(n_ff), dtype=np.float32)


__all__ = ["ROTATIONS", "TransformedSource", "down_rot_block", "hadamard", "hadamard_factors", "rotate_source",
           "rotation", "smooth_scales"]
