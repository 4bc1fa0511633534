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
  (:func:`orkpy.formats.source.open_source`; a checkpoint's architecture and tokenizer
  come from the allocation GGUF, whose tensor data is never used), the
  allocation a TierMap, a mixed GGUF or an emit-map file
  (:func:`orkpy.formats.source.read_allocation`). int8-tier linears -> per-channel
  int8, int4-tier linears -> NF4 (or uniform int4), both with imatrix-chosen
  scales; float-tier linears (e.g. a head kept float) stay float, as in
  ``load_model(weights=TierMap)``; embeddings and norms stay float.
- ``QuantizedModel.save(dir)``: the model directory (:mod:`orkpy.formats.modeldir`):
  ``manifest.json`` (tensor -> tier, kind, file, sha256; source / allocation /
  imatrix hashes; settings), one O4N1/O8N1 blob per packed linear, and
  ``float.gguf`` (the source's metadata, embeddings, norms, float linears),
  written to a temporary directory and renamed into place.
  ``orkpy.load_model(dir)`` verifies every checksum and refuses a mismatch.
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Sequence, Tuple, Union

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._io import counted, in_background, sha256_file
from .._typing import StrPath
from ..runtime import actcal
from ..runtime.actcal import ActCalibration
from ..kernels.actspec import ActSpec
from ..runtime.model import LinearSpec, Model, as_model, build_model, load_quantized
from ..formats.modeldir import MANIFEST, write_model_dir
from ..kernels.packed import PackedWeight
from .recipe import Recipe, keywords_given
from ..formats.source import FLOAT_TYPES, GGUFSource, Source
from ..formats.tiermap import TIER_BITS, TierMap, kind_tier

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
    with counted(chunk_iter, n_chunk, "imatrix", progress, "chunk") as each:
        stats = model.collect_activation_stats(each, threads)
    im = Imatrix()
    for name, (sums, count) in stats.items():
        if name != "output.weight":  # the head is left out
            im.add(name, sums, count)
    im.chunks = n_chunk
    im.chunk_size = n_ctx
    return im


# ------------------------------------------------------ whole-model quant --

class QuantizedModel:
    """Linear weights quantized per tier (``tensors``: name -> PackedWeight; ``tiers``: name ->
    tier, float-tier linears staying float), the source they came from, and the settings;
    ``save``, ``to_model``."""

    def __init__(self, source: str, tensors: Dict[str, PackedWeight], tiers: Dict[str, str], settings: Dict[str, Any],
                 hashes: Dict[str, Any], double_quant: bool, src: Optional[Source] = None,
                 act_calib: Optional[ActCalibration] = None, recipe: Optional[Recipe] = None) -> None:
        self.source = source
        self.recipe = recipe  # how it was made (orkpy.quantization.recipe), recorded in the manifest
        self.act_calib = act_calib  # calibrated activation ranges / outlier channels (orkpy.runtime.actcal), saved with it
        self._src = src if src is not None else GGUFSource(source)
        self.tensors = tensors
        self.tiers = tiers
        self.settings = settings
        self.hashes = hashes
        self.double_quant = double_quant
        self._models: Dict[Any, Model] = {}
        self.alloc_map: Optional[TierMap] = None  # the allocation used (quantize_model sets it)
        self.alloc_report: Optional[Dict[str, Any]] = None  # target_bpw: the estimates (orkpy.quantization.alloc)
        self.path: Optional[str] = None  # the model directory quantize_model(output=) wrote
        self.timings: Dict[str, float] = {}  # quantize_model: seconds per stage (the layer-by-layer ones as "linears: ...")

    def float_linears(self) -> Dict[str, str]:
        """{float-tier linear name: the source tensor holding its weight}."""
        return {n: self._src.tensor_name(n) for n, t in self.tiers.items() if t == "float"}

    def result_bytes(self) -> Dict[str, int]:
        out = {t: 0 for t in TIER_BITS}
        for name, pw in self.tensors.items():
            out[kind_tier(pw.kind)] += pw.nbytes  # a 4-bit codebook counts as int4
        return out

    @property
    def tied(self) -> bool:
        """Whether the source's head is its embedding table (tied)."""
        return bool(self._src.tied)

    def npu_bytes(self) -> Tuple[int, int]:
        """(NPU weight bytes per token, packed weights): what the RK3588's NPU reads per decoded token
        for the packed linears (:func:`orkpy.quantization.npu_alloc.npu_nbytes`: int8 for every
        8-bit-activation tier, whatever its file bits; 4 bits for w4a4 / w4a8), and their weights."""
        from .npu_alloc import npu_nbytes
        nb = nw = 0
        for name, pw in self.tensors.items():
            N, K = pw.shape
            nb += npu_nbytes(self.tiers.get(name, kind_tier(pw.kind)), N, K)
            nw += N * K
        return nb, nw

    def int8_share(self) -> float:
        """The int8 share of weight storage: int8 bytes / (int8 + int4 bytes) of the
        packed linear weights (``PackedWeight.nbytes``); ``TierMap.int8_share()``
        gives the same figure for the allocation."""
        b = self.result_bytes()
        t = sum(b.values())
        return b["int8"] / t if t else 0.0

    def to_model(self, act: Union[str, ActSpec, None] = None, act_method: Optional[str] = None,
                 act_outliers: Optional[int] = None, act_prefix: Optional[int] = None) -> Model:
        """A Model running the packed weights in an activation spec (``load_model``'s ``act``, an
        :class:`orkpy.ActSpec` or a mode name with ``act_method``, ``act_outliers``, ``act_prefix``;
        the calibrated modes use :attr:`act_calib`; None and no legacy argument: the spec of its
        recipe, the one it was made for), cached per spec."""
        if act is None and act_method is None and act_outliers is None and act_prefix is None:
            key = self.recipe.activation if self.recipe is not None else ActSpec()
        else:
            key = ActSpec.parse("per_token" if act is None else act, act_method, act_outliers, act_prefix)
        if key not in self._models:
            src = self._src
            hp = dict(src.hp, packed_lookup=True) if self.settings.get("tied_lookup") == "packed" else src.hp

            def linear(n: str) -> Tuple[LinearSpec, str]:
                if n not in self.tensors:
                    return LinearSpec.f32(n, src.linear(n)), "gguf"
                pw = self.tensors[n]
                spec = actcal.resolve(key, n, self.act_calib, pw.K, os.path.basename(self.source), pw.kind,
                                       pw.group)
                return LinearSpec.from_packed(n, pw, act_spec=spec), pw.kind
            self._models[key] = build_model(src, linear, self.source, hp)
        return self._models[key]

    def _record(self) -> Dict[str, Any]:
        """The manifest's descriptive fields (orkpy.formats.modeldir)."""
        return {
            "source": {"file": os.path.basename(self.source), "sha256": self.hashes["source"]},
            "alloc": self.hashes["alloc"],
            "imatrix": self.hashes["imatrix"],
            "double_quant": self.double_quant,
            "settings": self.settings,
            "int8_share": self.int8_share(),
            **({} if self.recipe is None else {"recipe": self.recipe.to_dict()}),
        }

    def _act_bytes(self) -> Optional[bytes]:
        return None if self.act_calib is None else self.act_calib.to_bytes()

    def save(self, path: StrPath, overwrite: bool = False) -> str:
        """Write the model directory atomically (temp dir + rename); see :mod:`orkpy.formats.modeldir`."""
        return write_model_dir(path, self.tensors, self.tiers, self.float_linears(), self._src, self._record(),
                               overwrite, act_scales=self._act_bytes())

    def __repr__(self) -> str:
        return (f"QuantizedModel({os.path.basename(self.source)!r}, {len(self.tensors)} linears, "
                f"int8 share {self.int8_share():.1%}{', DOUBLE-QUANT' if self.double_quant else ''})")


def quantize_model(source: StrPath, alloc: Union[TierMap, StrPath, None] = None,
                   imatrix: Union[Imatrix, StrPath, None] = None, kind: str = "nf4", sr: bool = False, seed: int = 0,
                   threshold: float = 5.0, threads: Optional[int] = None, progress: bool = True,
                   clip_grid: Union[Sequence[float], NDArray[Any], None] = None,
                   log: Optional[Callable[[str], None]] = None, meta: Optional[StrPath] = None,
                   rotate: Optional[str] = None, rotate_seed: int = 0, smooth: Optional[float] = None,
                   calib: Union[str, ArrayLike, None] = None, calib_ctx: int = 512,
                   calib_chunks: Optional[int] = 8, rotate_online: bool = False,
                   act_prefix: int = actcal.DEFAULT_PREFIX, method: str = "rtn", awq: bool = False,
                   group_size: Optional[int] = None, target_bpw: Optional[float] = None,
                   target_options: Optional[Sequence[str]] = None, target_chunks: int = 2,
                   target_ctx: int = 256, target_sensitivity: str = "auto", tied_lookup: str = "float",
                   gptq_sequential: bool = False, gptq_precision: str = "float64",
                   output: Optional[StrPath] = None, overwrite: bool = False,
                   fallback: str = "infer", clip_search: str = "screen", rotate_placement: Optional[str] = None,
                   npu_bits: Optional[float] = None, npu_options: Sequence[str] = ("w4a4", "w4a8", "int8"),
                   npu_per_linear: bool = True, act_groups: bool = False, symmetric: bool = True,
                   recipe: Union[Recipe, StrPath, None] = None,
                   resume: bool = True) -> QuantizedModel:
    """Quantize every linear of ``source`` as ``recipe`` (an :class:`orkpy.Recipe`, a named recipe's
    name such as ``"q4km"``, or a recipe file's path; docs/recipes.md has every key and the named
    recipes) says; float-tier linears stay float.

    The inputs: ``source`` (a GGUF; F32/F16/BF16 = the intended fp16 source, a quantized GGUF =
    the double-quant comparison, said loudly; or a safetensors checkpoint), ``alloc`` (the
    allocation oracle: a TierMap, a mixed GGUF or an emit-map; None when the recipe's
    ``allocation.target_bpw`` chooses the tiers), ``imatrix`` (an Imatrix or its file; collected on
    the *transformed* model when the recipe rotates or smooths), ``calib`` (the calibration text
    or token ids, never the scored text: smoothing, AWQ, GPTQ, target_bpw and the activation
    ranges saved as ``act_scales.json`` are calibrated on it), ``meta`` (for a safetensors source,
    the GGUF of the same model that supplies the hyper-parameters and the tokenizer; default: the
    allocation GGUF). ``threads``, ``progress``, ``log`` never change a result. ``output`` (a
    folder; ``overwrite`` as in :meth:`QuantizedModel.save`): streaming -- each linear is written
    to the model directory as soon as it is quantized and held only as a mapping of that file, the
    source's pages released after each tensor; the directory appears (atomically, the bytes
    ``save`` writes) when everything is done, and the result's ``path`` names it; the peak memory
    is about one tensor's float32 copy plus a fixed overhead. With ``calib``, GPTQ and the
    activation ranges run layer by layer (:mod:`orkpy.quantization.layerwise`: one layer's float32
    weights and Gram matrices at a time, the same bytes as whole-model calibration); with
    ``output`` and ``resume`` (the default) each finished layer is saved in the folder
    ``<output>.orkpy-checkpoint``, a killed run given the same inputs continues after the last one
    saved (to the same bytes), and the folder is deleted once the directory is in place. AWQ's
    search runs inside that run, block by block, on the Gram matrices GPTQ uses; smoothing runs on
    the whole float model, target_bpw's sensitivities too below 1 GiB of float32 weights.

    The keyword form: without ``recipe``, the keywords ``kind`` ... ``symmetric`` are the
    recipe (:data:`orkpy.quantization.recipe.KEYWORDS` maps each to its key, e.g. ``calib_chunks`` ->
    ``calibration.chunks``, ``method`` -> ``rounding.method``, ``act_prefix`` ->
    ``activation.prefix``); with ``recipe``, they must keep their defaults. The recipe is checked,
    and against its inputs (``alloc`` xor ``allocation.target_bpw``; a calibration text where a
    key needs one), before any file is read: a :class:`orkpy.RecipeError` (a ValueError)
    names the key. The model directory's manifest records the recipe (``Recipe.load(dir)`` reads
    it back), the inputs by file name and sha256, and the settings loading needs.

    The stages (:mod:`orkpy.quantization.pipeline`): source -> transform -> allocate -> (AWQ scales ->) GPTQ or
    round-to-nearest, packed one linear at a time -> write -> activation calibration -> manifest.
    ``QuantizedModel.alloc_map`` is the allocation used (``.save(path)`` writes the emit-map),
    ``alloc_report`` target_bpw's estimates."""
    from .imatrix import Imatrix
    from .pipeline import (Inputs, RunOptions, allocate_stage, manifest_settings, open_stage, plan_linears,
                           quantize_stage, transform_stage)

    recipe = _recipe_of(recipe, dict(
        kind=kind, sr=sr, seed=seed, threshold=threshold, clip_grid=clip_grid, rotate=rotate, rotate_seed=rotate_seed,
        smooth=smooth, calib_ctx=calib_ctx, calib_chunks=calib_chunks, rotate_online=rotate_online,
        act_prefix=act_prefix, method=method, awq=awq, group_size=group_size, target_bpw=target_bpw,
        target_options=target_options, target_chunks=target_chunks, target_ctx=target_ctx,
        target_sensitivity=target_sensitivity, tied_lookup=tied_lookup,
        gptq_sequential=gptq_sequential, gptq_precision=gptq_precision, fallback=fallback, clip_search=clip_search,
        rotate_placement=rotate_placement, npu_bits=npu_bits, npu_options=tuple(npu_options),
        npu_per_linear=npu_per_linear, act_groups=act_groups, symmetric=symmetric))
    recipe.check_inputs(alloc is not None, calib is not None)
    if output is not None and os.path.lexists(output):  # before any work
        if not overwrite:
            raise FileExistsError(f"{os.path.abspath(os.fspath(output))} exists (pass overwrite=True to replace it)")
        from ..formats.modeldir import check_replaceable
        check_replaceable(output)  # only an orkpy model directory or an empty folder is replaced
    im = imatrix if (imatrix is None or isinstance(imatrix, Imatrix)) else Imatrix.load(imatrix)
    run = RunOptions(threads, progress, log if log is not None else (lambda msg: print(msg, file=sys.stderr)))
    inputs = Inputs(os.fspath(source), alloc, im, calib, meta)

    from .named import known_bad
    for msg in known_bad(recipe):  # settings measured to hurt, said first
        run.log(msg)
    clock = Stopwatch()
    opened = clock("open", open_stage, inputs, recipe)
    src = clock("transform", transform_stage, opened.src, recipe, calib, threads)
    allocated = clock("allocate", allocate_stage, opened, src, recipe, inputs, run)
    writer = None
    if output is not None:  # streaming: an error removes what was written (ModelDirWriter)
        from ..formats.modeldir import ModelDirWriter
        writer = ModelDirWriter(output, overwrite)
    # the manifest's file hashes (the source can be GBs) are read in a thread while the linears are
    # quantized: hashlib releases the GIL, and the read warms the page cache the quantizer maps
    hashes_of = in_background(lambda: (src.sha256(), allocated.allocation.info()))
    with writer if writer is not None else contextlib.nullcontext():
        double_quant = _double_quant(src, opened.names, inputs.source, run.log)
        plan = plan_linears(opened.names, allocated.tiers, recipe.allocation)
        tensors, tiers, act_calib, lw = clock("linears", quantize_stage, src, plan, recipe, inputs, run,
                                              writer, output if resume else None)
        src = src if lw is None else lw.src  # AWQ's scales folded in as the run went
        source_hash, alloc_info = hashes_of()
        hashes = {"source": source_hash, "alloc": alloc_info,
                  "imatrix": None if im is None else {"sha256": im.sha256(), "chunks": im.chunks}}
        qm = QuantizedModel(inputs.source, tensors, tiers, manifest_settings(recipe, src, im, tensors), hashes,
                            double_quant, src, act_calib, recipe)
        qm.alloc_map, qm.alloc_report = allocated.tiers, allocated.report
        if writer is not None:
            qm.path = clock("finish", writer.finish, qm.tiers, qm.float_linears(), src, qm._record(), qm._act_bytes())
        if lw is not None:
            lw.finished()
            clock.times.update({"linears: " + k: v for k, v in lw.timings.items()})
        qm.timings = clock.times
        run.log("stage seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in clock.times.items()))
        run.log(f"quantized {len(tensors)} linears of {os.path.basename(inputs.source)}: int8 share of weight storage "
                f"{qm.int8_share():.1%}")
        return qm


class Stopwatch:
    """``clock(stage, fn, *args)`` runs ``fn(*args)`` and adds its seconds to ``clock.times[stage]``."""

    def __init__(self) -> None:
        self.times: Dict[str, float] = {}

    def __call__(self, stage: str, fn: Callable[..., Any], *args: Any) -> Any:
        import time
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.times[stage] = self.times.get(stage, 0.0) + time.perf_counter() - t0


def _recipe_of(recipe: Union[Recipe, StrPath, None], kw: Dict[str, Any]) -> Recipe:
    """quantize_model's recipe: ``recipe``, or the one its keywords mean (the keyword form)."""
    if isinstance(recipe, (str, os.PathLike)):  # a named recipe, a recipe file or a model directory
        from .named import resolve_recipe
        recipe = resolve_recipe(recipe)
    if recipe is not None:
        if not isinstance(recipe, Recipe):
            raise TypeError(f"recipe must be an orkpy.Recipe, a named recipe's name or a recipe file's path "
                            f"(Recipe.load(path) reads a file), got {type(recipe).__name__}")
        given = keywords_given(kw)
        if given:
            raise ValueError(f"recipe= and the recipe keyword(s) {', '.join(k + '=' for k in given)} both given: "
                             "set them in the recipe")
        return recipe
    for k in ("sr", "rotate_online", "awq", "gptq_sequential", "act_groups", "symmetric"):  # truthy values, as the keywords took
        kw[k] = bool(kw[k])
    return Recipe.from_kwargs(**kw)


def _double_quant(src: Source, names: Sequence[str], source: str, log: Callable[[str], None]) -> bool:
    """Whether the source's linears are quantized (the double-quant comparison), said loudly."""
    quantized_src = sorted({src.type_of(src.tensor_name(n)) for n in names} - FLOAT_TYPES)
    if quantized_src:
        log("!" * 78 + f"\n!! DOUBLE QUANT: the source {os.path.basename(source)} holds quantized tensors "
            f"({', '.join(quantized_src)}).\n!! They are dequantized and quantized AGAIN. This is the comparison "
            "configuration,\n!! not the product's path (fp16 is the source; a mixed GGUF only allocates).\n" + "!" * 78)
    return bool(quantized_src)


def calibrate_activations(model: Union[Model, QuantizedModel], text_or_tokens: Union[str, ArrayLike],
                          n_ctx: int = 512, chunks: Optional[int] = 8, threads: Optional[int] = None,
                          progress: bool = True, prefix: int = actcal.DEFAULT_PREFIX) -> ActCalibration:
    """Static activation ranges (``max`` and ``mse``) and outlier channels of every linear of
    ``model``, from its inputs on ``chunks`` chunks of ``n_ctx`` tokens of calibration text
    (:mod:`orkpy.runtime.actcal`), the block linears' first ``prefix`` positions left out (the static mode
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
