"""Calibration and whole-model quantization.

The product's workflow: the fp16 source supplies the weights, a llama.cpp
mixed GGUF supplies only the allocation (its per-tensor types -> int8 / int4
tiers; its quantized bytes are never used), an importance matrix gathered in
the forward pass chooses the scales, and the result is persisted, reloaded and
gated by perplexity.

- ``collect_imatrix(model, text_or_tokens, n_ctx=512, chunks=None)``: sum of
  squared input activations per input channel of every linear, accumulated
  inside the C forward pass (llama.cpp's ``in_sum2`` / ``counts``; every token
  of every chunk counts; the first token of a chunk is BOS when the vocabulary
  adds one; the head is left out, as llama-imatrix does by default).
- ``quantize_model(source, alloc, imatrix=None, kind="nf4", ...)``: the source
  is an F32/F16/BF16 GGUF or a Hugging Face safetensors checkpoint
  (:func:`orkpy.source.open_source`; a checkpoint's architecture and tokenizer
  come from the allocation GGUF, whose tensor data is never used), the
  allocation a TierMap, a mixed GGUF or an emit-map file
  (:func:`orkpy.source.read_allocation`). int8-tier linears -> per-channel
  int8, int4-tier linears -> NF4 (or uniform int4), both with imatrix-chosen
  scales; float-tier linears (e.g. a head kept float) stay float, as in
  ``load_model(weights=TierMap)``; embeddings and norms stay float.
- ``QuantizedModel.save(dir)``: the model directory (:mod:`orkpy.modeldir`):
  ``manifest.json`` (tensor -> tier, kind, file, sha256; source / allocation /
  imatrix hashes; settings), one O4N1/O8N1 blob per packed linear, and
  ``float.gguf`` (the source's metadata, embeddings, norms, float linears),
  written to a temporary directory and renamed into place.
  ``orkpy.load_model(dir)`` verifies every checksum and refuses a mismatch.
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, Optional, Sequence, Union

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._io import in_background, progress_bar, sha256_file
from ._typing import StrPath
from . import actcal
from .actcal import ActCalibration
from .actspec import ActSpec
from .model import (LinearSpec, Model, as_model, calibrate_source_acts, linear_names, load_quantized, tier_path,
                    transformed_source)
from .modeldir import MANIFEST, write_model_dir
from .packed import PackedWeight, pack
from .quant import CLIP_SEARCHES, FOUR_BIT_KINDS, check_group, quantize
from .rotate import TransformedSource
from .source import FLOAT_TYPES, GGUFSource, Source, open_source, read_allocation
from .tiermap import OUTPUT, TIER_BITS, TierMap, grouped_tier, kind_tier, split_tier

if TYPE_CHECKING:
    from .imatrix import Imatrix


# ---------------------------------------------------------------- imatrix --

def collect_imatrix(model: Union[Model, QuantizedModel], text_or_tokens: Union[str, ArrayLike], n_ctx: int = 512,
                    chunks: Optional[int] = None, threads: Optional[int] = None, progress: bool = True) -> Imatrix:
    """Importance matrix of every linear weight (except the head) on a text."""
    from .imatrix import Imatrix

    model = as_model(model)
    tokens = model.tokens(text_or_tokens)
    n_chunk, chunk_iter = model.chunks(tokens, n_ctx, chunks)
    bar = progress_bar(n_chunk, "imatrix", progress, "chunk")

    def counted() -> Iterator[NDArray[np.int32]]:
        for chunk in chunk_iter:
            yield chunk
            if bar is not None:
                bar.update(1)
    try:
        stats = model.collect_activation_stats(counted(), threads)
    finally:
        if bar is not None:
            bar.close()
    im = Imatrix()
    for name, (sums, count) in stats.items():
        if name != "output.weight":  # the head is left out
            im.add(name, sums, count)
    im.chunks = n_chunk
    im.chunk_size = n_ctx
    return im


# ------------------------------------------------------ whole-model quant --

def _count(values: Any) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


class QuantizedModel:
    """Linear weights quantized per tier (``tensors``: name -> PackedWeight; ``tiers``: name ->
    tier, float-tier linears staying float), the source they came from, and the settings;
    ``save``, ``to_model``."""

    def __init__(self, source: str, tensors: Dict[str, PackedWeight], tiers: Dict[str, str], settings: Dict[str, Any],
                 hashes: Dict[str, Any], double_quant: bool, src: Optional[Source] = None,
                 act_calib: Optional[ActCalibration] = None) -> None:
        self.source = source
        self.act_calib = act_calib  # calibrated activation ranges / outlier channels (orkpy.actcal), saved with it
        self._src = src if src is not None else GGUFSource(source)
        self.tensors = tensors
        self.tiers = tiers
        self.settings = settings
        self.hashes = hashes
        self.double_quant = double_quant
        self._models: Dict[Any, Model] = {}
        self.alloc_map: Optional[TierMap] = None  # the allocation used (quantize_model sets it)
        self.alloc_report: Optional[Dict[str, Any]] = None  # target_bpw: the estimates (orkpy.alloc)
        self.path: Optional[str] = None  # the model directory quantize_model(output=) wrote

    def float_linears(self) -> Dict[str, str]:
        """{float-tier linear name: the source tensor holding its weight}."""
        return {n: self._src.tensor_name(n) for n, t in self.tiers.items() if t == "float"}

    def result_bytes(self) -> Dict[str, int]:
        out = {t: 0 for t in TIER_BITS}
        for name, pw in self.tensors.items():
            out[kind_tier(pw.kind)] += pw.nbytes  # a 4-bit codebook counts as int4
        return out

    def int8_share(self) -> float:
        """The int8 share of weight storage: int8 bytes / (int8 + int4 bytes) of the
        packed linear weights (``PackedWeight.nbytes``); ``TierMap.int8_share()``
        gives the same figure for the allocation."""
        b = self.result_bytes()
        t = sum(b.values())
        return b["int8"] / t if t else 0.0

    def to_model(self, act: Union[str, ActSpec] = "per_token", act_method: Optional[str] = None,
                 act_outliers: Optional[int] = None, act_prefix: Optional[int] = None) -> Model:
        """A Model running the packed weights in an activation spec (``load_model``'s ``act``, an
        :class:`orkpy.ActSpec` or a mode name with ``act_method``, ``act_outliers``, ``act_prefix``;
        the calibrated modes use :attr:`act_calib`), cached per spec."""
        key = ActSpec.parse(act, act_method, act_outliers, act_prefix)
        if key not in self._models:
            src = self._src
            hp = dict(src.hp, packed_lookup=True) if self.settings.get("tied_lookup") == "packed" else src.hp
            linears: Dict[str, LinearSpec] = {}
            paths: Dict[str, str] = {}
            for n in linear_names(src.hp):
                if n in self.tensors:
                    pw = self.tensors[n]
                    spec = actcal.resolve(key, n, self.act_calib, pw.K, os.path.basename(self.source))
                    linears[n], paths[n] = LinearSpec.from_packed(n, pw, spec), pw.kind
                else:
                    linears[n], paths[n] = LinearSpec.f32(n, src.linear(n)), "gguf"
            self._models[key] = Model(self.source, hp, linears, src.tensor, src.meta, src.tied, paths)
        return self._models[key]

    def _record(self) -> Dict[str, Any]:
        """The manifest's descriptive fields (orkpy.modeldir)."""
        return {
            "source": {"file": os.path.basename(self.source), "sha256": self.hashes["source"]},
            "alloc": self.hashes["alloc"],
            "imatrix": self.hashes["imatrix"],
            "double_quant": self.double_quant,
            "settings": self.settings,
            "int8_share": self.int8_share(),
        }

    def _act_bytes(self) -> Optional[bytes]:
        return None if self.act_calib is None else self.act_calib.to_bytes()

    def save(self, path: StrPath, overwrite: bool = False) -> str:
        """Write the model directory atomically (temp dir + rename); see :mod:`orkpy.modeldir`."""
        return write_model_dir(path, self.tensors, self.tiers, self.float_linears(), self._src, self._record(),
                               overwrite, act_scales=self._act_bytes())

    def __repr__(self) -> str:
        return (f"QuantizedModel({os.path.basename(self.source)!r}, {len(self.tensors)} linears, "
                f"int8 share {self.int8_share():.1%}{', DOUBLE-QUANT' if self.double_quant else ''})")


def quantize_model(source: StrPath, alloc: Union[TierMap, StrPath, None], imatrix: Union[Imatrix, StrPath, None] = None,
                   kind: str = "nf4", sr: bool = False, seed: int = 0, threshold: float = 5.0,
                   threads: Optional[int] = None, progress: bool = True,
                   clip_grid: Union[Sequence[float], NDArray[Any], None] = None,
                   log: Optional[Callable[[str], None]] = None, meta: Optional[StrPath] = None,
                   rotate: Optional[str] = None, rotate_seed: int = 0, smooth: Optional[float] = None,
                   calib: Union[str, ArrayLike, None] = None, calib_ctx: int = 512,
                   calib_chunks: Optional[int] = 8, rotate_online: bool = False,
                   act_prefix: int = actcal.DEFAULT_PREFIX, method: str = "rtn", awq: bool = False,
                   group_size: Optional[int] = None, target_bpw: Optional[float] = None,
                   target_options: Optional[Sequence[str]] = None, target_chunks: int = 2,
                   target_ctx: int = 256, tied_lookup: str = "float", gptq_sequential: bool = False,
                   output: Optional[StrPath] = None, overwrite: bool = False,
                   fallback: str = "infer", clip_search: str = "screen") -> QuantizedModel:
    """Quantize every linear of ``source`` (a GGUF; F32/F16/BF16 = the intended
    fp16 source, a quantized GGUF = the double-quant comparison; or a safetensors
    checkpoint) with the tiers of ``alloc`` (a TierMap, a mixed GGUF or an
    emit-map file); float-tier linears stay float. ``meta``: for a safetensors
    source, the GGUF of the same model that supplies the hyper-parameters and the
    tokenizer (default: the allocation GGUF; needed when ``alloc`` is a map).
    ``rotate`` / ``rotate_online`` / ``smooth`` (with ``calib``, a calibration text): the
    source is rotated and/or smoothed first (:func:`orkpy.model.transformed_source`, :mod:`orkpy.rotate`)
    and saved so (the manifest's settings record how); an ``imatrix`` must then have been
    collected on the transformed model (``load_model(source, rotate=..., smooth=...,
    calib=...)``), since the linears' inputs are the transformed ones. With ``calib``, the
    activations are calibrated too (:func:`orkpy.model.calibrate_source_acts`: the static ranges
    and outlier channels of :mod:`orkpy.actcal`, on the transformed source in float32, the first
    ``act_prefix`` positions left out) and saved with the model (``act_scales.json``), so
    ``load_model(dir, act="static")`` runs. ``method``: ``"rtn"`` (round to nearest, the default) or
    ``"gptq"`` (with ``calib``): every quantized linear is rounded by GPTQ
    (:func:`orkpy.gptq.gptq_linears`: error compensation on the linear's input Gram matrix on
    ``calib``, collected by the transformed source in float32) instead of plain rounding; the int8
    tier keeps absmax scales, the 4-bit tier's scales come from the imatrix clip search with the
    Gram matrix's diagonal as the importance (``imatrix`` is then not used); ``gptq_sequential``:
    the Gram matrices layer by layer on the layers before as already quantized
    (``gptq_linears(..., sequential=True)``; recorded in the settings). ``awq`` (with
    ``calib``): AWQ-style per-input-channel scales searched on ``calib`` and folded into the
    norms / producing linears before rounding (:mod:`orkpy.awq`; after a rotation, not with
    ``smooth``); an ``imatrix`` is rescaled to the scaled inputs (``/ s^2``). ``group_size`` (a
    multiple of 32): group-wise scales, one per ``group_size`` inputs of a row, for every packed
    linear whose tier does not name its own (an allocation's ``"int4-g32"`` tier wins; csrc/ork/pack.h;
    float16 scales, saved as O4N1/O8N1 version 3). ``target_bpw`` (with ``calib``; ``alloc`` must then be None):
    the tiers are chosen by :func:`orkpy.alloc.target_allocation` (options ``target_options``,
    default :data:`orkpy.alloc.DEFAULT_OPTIONS`; sensitivities measured on ``target_chunks``
    chunks of ``target_ctx`` tokens of ``calib``, on the transformed source) so that the packed
    linears take at most that many bits per weight at the least estimated KL; the chosen map is
    ``QuantizedModel.alloc_map`` (``.save(path)`` writes the emit-map) and the estimates
    ``QuantizedModel.alloc_report``. ``tied_lookup``: for a tied model whose head is packed,
    ``"float"`` (the default) keeps the embedding table in float for the token lookup (stored twice:
    float and packed); ``"packed"`` reads the lookup rows from the packed head (dequantized), so the
    table is stored once and the lookup sees the same quantized rows as the head (llama.cpp's
    tied files do the same). ``output`` (a folder; ``overwrite`` as in :meth:`QuantizedModel.save`):
    streaming -- each linear is written to the model directory as soon as it is quantized and held
    only as a mapping of that file, the source's pages are released after each tensor, and the
    directory appears at ``output`` (atomically, with the same bytes ``save`` writes) when
    everything is done; the result's ``path`` names it. The peak memory is then about one
    tensor's float32 copy plus a fixed overhead, not the model (calibration, GPTQ and AWQ still
    hold what they need). ``fallback``: how a GGUF ``alloc`` is read (:func:`orkpy.tier_map`):
    ``"infer"`` tiers tensors llama-quantize stored on fallback types by their intended types,
    ``"literal"`` by the stored types. ``clip_search``: the imatrix clip search of the 4-bit
    tiers, ``"screen"`` or ``"full"`` (:func:`orkpy.quantize`'s ``search``; recorded in the
    settings whenever there is an imatrix; ``"full"`` only with method ``"rtn"``, no ``awq``, an
    allocation oracle)."""
    from .gptq import DEFAULT_BLOCK, DEFAULT_DAMP, gptq_linears
    from .imatrix import Imatrix

    if kind not in FOUR_BIT_KINDS:
        raise ValueError(f"kind must be one of {', '.join(FOUR_BIT_KINDS)} (the int4 tier's codebook), got {kind!r}")
    if clip_search not in CLIP_SEARCHES:
        raise ValueError(f"clip_search must be one of {', '.join(map(repr, CLIP_SEARCHES))}, got {clip_search!r}")
    if clip_search == "full" and (method == "gptq" or awq or target_bpw is not None):
        raise ValueError("clip_search='full' applies to the plain rounding of the linears (method='rtn', no awq, an "
                         "allocation oracle): GPTQ's scales, AWQ's and target_bpw's searches use the screened search")
    if method not in ("rtn", "gptq"):
        raise ValueError(f"method must be 'rtn' or 'gptq', got {method!r}")
    gptq = method == "gptq"
    if gptq and calib is None:
        raise ValueError("method='gptq' needs calib= (a calibration text or token ids, not the scored text)")
    if output is not None and os.path.lexists(output) and not overwrite:  # before any work
        raise FileExistsError(f"{os.path.abspath(os.fspath(output))} exists (pass overwrite=True to replace it)")
    if gptq_sequential and not gptq:
        raise ValueError("gptq_sequential=True applies to method='gptq' only")
    if awq and calib is None:
        raise ValueError("awq=True needs calib= (a calibration text or token ids, not the scored text)")
    if awq and smooth is not None:
        raise ValueError("awq=True and smooth= fold scales into the same places: choose one")
    if gptq and sr:
        raise ValueError("method='gptq' and sr=True exclude each other: GPTQ chooses every int8 code itself")
    if tied_lookup not in ("float", "packed"):
        raise ValueError(f"tied_lookup must be 'float' or 'packed', got {tied_lookup!r}")
    if not (imatrix is None or isinstance(imatrix, Imatrix)):
        imatrix = Imatrix.load(imatrix)
    group_size = check_group(group_size) or None
    log = log if log is not None else (lambda msg: print(msg, file=sys.stderr))
    source = os.fspath(source)
    alloc_report = None
    if target_bpw is not None:
        from .alloc import DEFAULT_OPTIONS, target_allocation
        if alloc is not None:
            raise ValueError("give either alloc= (an allocation oracle) or target_bpw= (a size), not both")
        if calib is None:
            raise ValueError("target_bpw= needs calib= (the text its sensitivities are measured on)")
        if group_size:
            raise ValueError("target_bpw= chooses each linear's group size itself (target_options=); "
                             "group_size= applies to an oracle allocation")
        src = open_source(source, meta)
        src = transformed_source(src, rotate, rotate_seed, smooth, calib, calib_ctx, calib_chunks, threads,
                                 rotate_online)
        tm, alloc_report = target_allocation(src, calib, target_bpw, tuple(target_options or DEFAULT_OPTIONS), kind,
                                             imatrix, target_ctx, target_chunks, threads, progress)
        allocation = read_allocation(tm, threshold)
        names = linear_names(src.hp)
        log(f"target_bpw {target_bpw:g}: {alloc_report['bpw']:.3f} bits per linear weight, "
            + ", ".join(f"{t}: {c}" for t, c in sorted(_count(alloc_report["tiers"].values()).items())))
    else:
        if alloc is None:
            raise ValueError("alloc= is required (a mixed GGUF, an emit-map or a TierMap) unless target_bpw= is given")
        allocation = read_allocation(alloc, threshold, fallback)
        tm = allocation.tiers
        src = open_source(source, meta if meta is not None else allocation.gguf)
        names = linear_names(src.hp)
        tm = src.split_tier_map(tm)  # entries for fused tensors (phi3's attn_qkv, ffn_up) -> their parts
        tm.check_fits(src.shapes(), os.path.basename(source), names, what="allocation")
        src = transformed_source(src, rotate, rotate_seed, smooth, calib, calib_ctx, calib_chunks, threads,
                                 rotate_online)
    awq_cols: Dict[str, NDArray[Any]] = {}
    if awq and calib is not None:
        from .awq import apply_awq, awq_scales, column_scales
        qkinds = {n: tier_path(tm.linear_tier(n), kind) for n in names}
        scales, arep = awq_scales(src, calib, {n: k for n, k in qkinds.items() if k != "gguf"}, n_ctx=calib_ctx,
                                  chunks=calib_chunks, threads=threads, progress=progress)
        src = apply_awq(src, scales, {"n_ctx": arep["n_ctx"], "chunks": arep["chunks"], "alpha": arep["alpha"]})
        awq_cols = column_scales(src.hp, scales)
        log(f"awq: scales of {len(scales)} groups folded in (alpha per group: "
            + ", ".join(f"{a:g}: {sum(1 for v in arep['alpha'].values() if v == a)}"
                        for a in sorted(set(arep["alpha"].values()))) + ")")
    writer = None
    if output is not None:  # streaming: an error removes what was written (ModelDirWriter)
        from .modeldir import ModelDirWriter
        writer = ModelDirWriter(output, overwrite)
    # the manifest's file hashes (the source can be GBs) are read in a thread while the linears are
    # quantized: hashlib releases the GIL, and the read warms the page cache the quantizer maps
    hashes_of = in_background(lambda: (src.sha256(), allocation.info()))
    with writer if writer is not None else contextlib.nullcontext():
        quantized_src = sorted({src.type_of(src.tensor_name(n)) for n in names} - FLOAT_TYPES)
        double_quant = bool(quantized_src)
        if double_quant:
            log("!" * 78 + f"\n!! DOUBLE QUANT: the source {os.path.basename(source)} holds quantized tensors "
                f"({', '.join(quantized_src)}).\n!! They are dequantized and quantized AGAIN. This is the comparison "
                "configuration,\n!! not the product's path (fp16 is the source; a mixed GGUF only allocates).\n" + "!" * 78)
        tensors, tiers = {}, {}
        gq = {}
        if gptq and calib is not None:
            kinds = {n: tier_path(tm.linear_tier(n), kind) for n in names}
            kinds = {n: k for n, k in kinds.items() if k != "gguf"}
            gsizes = {n: split_tier(tm.linear_tier(n))[1] or (group_size or 0) for n in kinds}
            gq = gptq_linears(src, calib, kinds, n_ctx=calib_ctx, chunks=calib_chunks, names=list(kinds),
                              threads=threads, progress=progress, group_size=gsizes, sequential=bool(gptq_sequential))
        bar = progress_bar(len(names), "quantize", progress, "tensor")
        scratch = np.empty(0, np.float32)
        shapes = src.shapes()  # (a copy per call: read once)
        for name in names:
            tier = tm.linear_tier(name)
            qkind = tier_path(tier, kind)
            if qkind != "gguf" and split_tier(tier)[1] == 0 and group_size:
                tier = grouped_tier(tier, group_size)
            tiers[name] = tier
            gsize = split_tier(tier)[1] or None
            if qkind == "gguf":  # the float tier: the linear stays float
                if bar is not None:
                    bar.update(1)
                continue
            if name in gq:
                tensors[name] = pack(gq.pop(name))
                if writer is not None:
                    tensors[name] = writer.add(name, tensors[name], tier)
                if bar is not None:
                    bar.update(1)
                continue
            w16 = src.linear_stored(name)  # float16 as stored: quantize converts each row on its threads
            w: NDArray[Any]
            if w16 is not None:
                w = w16
            else:
                shape = shapes[src.tensor_name(name)]
                if scratch.size < shape[0] * shape[1]:  # one float32 buffer for every linear: no fresh pages each
                    scratch = np.empty(shape[0] * shape[1], np.float32)
                w = src.linear(name, scratch=scratch[:shape[0] * shape[1]].reshape(shape))
            im = imatrix.values(name) if (imatrix is not None and name in imatrix) else None
            if im is not None and name in awq_cols and im.shape == awq_cols[name].shape:
                im = (np.asarray(im, np.float64) / awq_cols[name] ** 2).astype(np.float32)  # the scaled inputs' importance
            if im is not None and im.shape != (w.shape[1],):
                where = f"{imatrix.path}: " if imatrix is not None and imatrix.path else ""
                raise ValueError(f"{where}the imatrix entry for {name!r} has {im.size} values but the tensor has "
                                 f"K = {w.shape[1]} input columns: the imatrix is for a different model")
            q = quantize(w, qkind, imatrix=im, sr=sr, seed=seed, clip_grid=clip_grid, threads=threads, group_size=gsize,
                         search=clip_search)
            del w
            tensors[name] = pack(q)
            del q
            if writer is not None:  # streaming: the packed bytes go to disk (on the writer's thread, while the
                # next linear is quantized), the source's pages back to the kernel
                writer.add_later(name, tensors[name], tier, functools.partial(tensors.__setitem__, name))
                src.release()
            if bar is not None:
                bar.update(1)
        if writer is not None:
            writer.wait()  # every linear now maps its file
        if bar is not None:
            bar.close()
        settings = {"kind": kind, "sr": bool(sr), "seed": int(seed), "threshold": float(threshold),
                    "clip_grid": None if clip_grid is None else [float(x) for x in clip_grid],
                    "rotate": rotate, "rotate_seed": int(rotate_seed) if (rotate is not None or rotate_online) else None,
                    "rotate_online": bool(rotate_online),
                    "smooth": None if smooth is None else float(smooth),
                    "gptq": {"damp": DEFAULT_DAMP, "block": DEFAULT_BLOCK, "n_ctx": int(calib_ctx),
                             "chunks": calib_chunks, **({"sequential": True} if gptq_sequential else {})}
                    if gptq else None,
                    "transform": src.info() if isinstance(src, TransformedSource) else None}
        if awq:  # only then: without it the manifest stays byte-identical to earlier releases
            settings["awq"] = True
        if group_size:
            settings["group_size"] = int(group_size)
        if imatrix is not None or clip_search != "screen":  # the search that chose the 4-bit scales
            settings["clip_search"] = clip_search
        source_hash, alloc_info = hashes_of()
        hashes = {"source": source_hash, "alloc": alloc_info,
                  "imatrix": None if imatrix is None else {"sha256": imatrix.sha256(), "chunks": imatrix.chunks}}
        act_calib = None
        if calib is not None:
            act_calib = calibrate_source_acts(src, calib, calib_ctx, calib_chunks, threads, act_prefix)
            log(f"calibrated the activations of {len(act_calib)} linears on {act_calib.info['chunks']} chunks of "
                f"{calib_ctx} tokens")
        if target_bpw is not None:
            settings["target_bpw"] = float(target_bpw)
        if tied_lookup == "packed" and src.tied and OUTPUT in tensors:  # only then: otherwise nothing changes
            settings["tied_lookup"] = "packed"
        qm = QuantizedModel(source, tensors, tiers, settings, hashes, double_quant, src, act_calib)
        qm.alloc_map = tm
        qm.alloc_report = alloc_report
        if writer is not None:
            qm.path = writer.finish(qm.tiers, qm.float_linears(), src, qm._record(), qm._act_bytes())
        log(f"quantized {len(tensors)} linears of {os.path.basename(source)}: int8 share of weight storage "
            f"{qm.int8_share():.1%}")
        return qm


def calibrate_activations(model: Union[Model, QuantizedModel], text_or_tokens: Union[str, ArrayLike],
                          n_ctx: int = 512, chunks: Optional[int] = 8, threads: Optional[int] = None,
                          progress: bool = True, prefix: int = actcal.DEFAULT_PREFIX) -> ActCalibration:
    """Static activation ranges (``max`` and ``mse``) and outlier channels of every linear of
    ``model``, from its inputs on ``chunks`` chunks of ``n_ctx`` tokens of calibration text
    (:mod:`orkpy.actcal`), the block linears' first ``prefix`` positions left out (the static mode
    quantizes them per token); pass the result to ``load_model(..., act_calib=)``."""
    return actcal.calibrate_activations(as_model(model), text_or_tokens, n_ctx, chunks, threads, progress,
                                        prefix=prefix)


def calibrate_act_scales(model: Union[Model, QuantizedModel], text_or_tokens: Union[str, ArrayLike],
                         n_ctx: int = 512, chunks: Optional[int] = 8, method: str = "mse",
                         threads: Optional[int] = None, progress: bool = True,
                         prefix: int = actcal.DEFAULT_PREFIX) -> Dict[str, float]:
    """{linear name: static activation range} by ``method`` (``"mse"`` or ``"max"``): the ``c``
    of ``q = clamp(round(x * 127 / c), -127, 127)``, int8 step ``c / 127``
    (:func:`calibrate_activations`)."""
    actcal.check_method(method)
    return calibrate_activations(model, text_or_tokens, n_ctx, chunks, threads, progress, prefix).clips(method)


__all__ = ["MANIFEST", "QuantizedModel", "calibrate_act_scales", "calibrate_activations", "collect_imatrix", "load_quantized", "quantize_model", "sha256_file",
           "PackedWeight"]
