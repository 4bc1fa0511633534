"""The quantization pipeline as named stages, each a function with typed inputs and outputs;
:func:`orkpy.quantization.calibrate.quantize_model` runs a :class:`~orkpy.Recipe` through them
(docs/recipes.md):

    open_stage       Inputs, Recipe                    -> Opened     the source read, its float tensors
                                                                     checked finite; an oracle's tiers
                                                                     read and checked against it
    transform_stage  Source, Recipe, calib             -> Source     rotation / SmoothQuant folded in
    allocate_stage   Opened, Source, Recipe, Inputs    -> Allocated  the oracle's tiers, or target_bpw's
                                                                     choice (its sensitivities measured)
    plan_linears     names, TierMap, AllocationSpec    -> {name: LinearPlan}  tier, kind, group per linear
    quantize_stage   Source, plan, Recipe, Inputs, ... -> packed linears, tiers, ActCalibration | None
                       with a calibration text: layer by layer (orkpy.quantization.layerwise: AWQ's
                       scales searched and folded in, GPTQ, the static activation ranges,
                       resumable); without: round_linears
    round_linears    Source, plan, RoundingSpec, ...   -> Iterator[Rounded]  each linear rounded and
                                                                     packed, one at a time
    write_linears    Iterator[Rounded], writer         -> ({name: PackedWeight}, {name: tier})
    manifest_settings     Recipe, Source, imatrix, ... -> the manifest's ``settings``

Calibration is not one stage: smoothing and target_bpw's sensitivities measure what they need on
the recipe's calibration chunks (target_bpw's a layer at a time above 1 GiB of float32 weights),
each on the source as the stages before left it; AWQ's search, GPTQ and the static activation
ranges run layer by layer in
:func:`quantize_stage` (:mod:`orkpy.quantization.layerwise`: one layer's float32 weights and Gram
matrices at a time, byte for byte what the whole-model functions
:func:`orkpy.quantization.gptq.gptq_linears` and :func:`orkpy.runtime.model.calibrate_source_acts`
give). Rounding and packing are one step per linear: with ``output=`` each is written while the
next is rounded, and only one linear's float32 copy is held at a time.
"""
from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List, NamedTuple, Optional, Tuple, Union

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._io import progress_bar
from .._typing import StrPath
from ..runtime.actcal import ActCalibration
from ..runtime.model import linear_names, tier_path, transformed_source
from ..formats.modeldir import ModelDirWriter
from ..kernels.packed import PackedWeight, pack
from ..kernels.quant import QuantizedTensor
from .recipe import AllocationSpec, Recipe, RoundingSpec
from .rounding import LinearPlan, Rounded, RunOptions, importance, round_linear
from ..runtime.rotate import TransformedSource
from ..formats.source import Allocation, Source, open_source, read_allocation
from ..formats.tiermap import OUTPUT, TierMap, grouped_tier, split_tier

if TYPE_CHECKING:
    from .imatrix import Imatrix


class Inputs(NamedTuple):
    """What a recipe runs on (never part of it): the source path, the allocation oracle (a
    TierMap, a mixed GGUF or an emit-map; None with ``allocation.target_bpw``), the imatrix, the
    calibration text or token ids, and the GGUF of a safetensors source's metadata."""

    source: str
    alloc: Union[TierMap, StrPath, None]
    imatrix: Optional["Imatrix"]
    calib: Union[str, ArrayLike, None]
    meta: Optional[StrPath]


class Opened(NamedTuple):
    """The source as read, its linears (forward order) and, for an oracle, the allocation and
    its tiers (fused tensors split into their parts, checked against the source's shapes)."""

    src: Source
    names: List[str]
    allocation: Optional[Allocation]
    tiers: Optional[TierMap]


class Allocated(NamedTuple):
    """The tier map used, the allocation the manifest records, target_bpw's estimates (or None)."""

    tiers: TierMap
    allocation: Allocation
    report: Optional[Dict[str, Any]]


def open_stage(inputs: Inputs, recipe: Recipe) -> Opened:
    """Read the source and, unless ``allocation.target_bpw`` or ``allocation.npu_bits`` chooses the
    tiers later, the allocation oracle (checked to fit the source); a ``target_bpw`` below the
    smallest size its tiers reach is refused here."""
    a = recipe.allocation
    if a.target_bpw is not None or a.npu_bits is not None:
        src = open_source(inputs.source, inputs.meta)
        _check_float_tensors(src)
        if a.target_bpw is not None:  # an unreachable size fails here, before any measurement
            from .alloc import DEFAULT_OPTIONS, check_target
            check_target(src, a.target_bpw, tuple(a.target_options or DEFAULT_OPTIONS))
        return Opened(src, linear_names(src.hp), None, None)
    if inputs.alloc is None:
        raise ValueError("alloc= is required (a mixed GGUF, an emit-map or a TierMap) unless target_bpw= or npu_bits= is given")
    allocation = read_allocation(inputs.alloc, a.threshold, a.fallback)
    src = open_source(inputs.source, inputs.meta if inputs.meta is not None else allocation.gguf)
    names = linear_names(src.hp)
    tm = src.split_tier_map(allocation.tiers)  # entries for fused tensors (phi3's attn_qkv, ffn_up) -> their parts
    tm.check_fits(src.shapes(), os.path.basename(inputs.source), names, what="allocation")
    _check_float_tensors(src)
    return Opened(src, names, allocation, tm)


def _check_float_tensors(src: Source) -> None:
    """Refuse a source whose norms, biases or embedding table hold a NaN or an infinity
    (FormatError naming the file and the tensor) before any work; each linear is refused the same
    way when it is first read, before it is rounded (:func:`orkpy.formats.source.check_finite`)."""
    src.check_finite(src.float_names())
    src.release()   # the embedding table's pages / dequantized copy: read again when it is needed


def transform_stage(src: Source, recipe: Recipe, calib: Union[str, ArrayLike, None],
                    threads: Optional[int]) -> Source:
    """The source rotated and/or smoothed as ``recipe.transform`` says (itself if neither)."""
    t, c = recipe.transform, recipe.calibration
    return transformed_source(src, t.rotate, t.rotate_seed, t.smooth, calib, c.ctx, c.chunks, threads, t.rotate_online,
                              t.rotate_placement)


def four_bit_oracle_note(allocation: Any, tm: TierMap) -> Optional[str]:
    """A warning when a GGUF oracle that its file type calls 4-bit (or less: Q4_1, Q4_K_M, IQ4_XS,
    Q3_K_M, ...) maps every linear to int8 at the threshold (Q4_1 is 5.0 bits per weight with its
    scales: int8 at the default threshold 5), saying which threshold gives its 4-bit types the int4
    tier; None otherwise."""
    import re
    from ..formats.gguf import GGUFFile, ggml_type_info
    from ..formats.tiermap import FILE_TYPES
    if allocation.kind != "gguf" or allocation.path is None:
        return None
    ft = GGUFFile(allocation.path).metadata.get("general.file_type")
    name = FILE_TYPES.get(ft, ("", ""))[0] if isinstance(ft, int) else ""
    if not re.search(r"_(I?Q[1-4])", name):
        return None
    tiers = [(n, e) for n, e in tm.entries.items() if split_tier(e.tier)[0] not in ("float",)]
    if not tiers or any(split_tier(e.tier)[0] != "int8" for _, e in tiers):
        return None
    low = {e.intended or e.ggml_type for _, e in tiers if re.match(r"I?Q[1-4]_", e.intended or e.ggml_type)}
    top = max((ggml_type_info(t)["bits_per_weight"] for t in low), default=0.0)
    fix = (f"--threshold {top + 0.25:g} (allocation.threshold) maps its {', '.join(sorted(low))} tensors "
           f"({top:g} bits per weight with their scales) to int4" if low
           else "an emit-map (--emit-map, then edit) or --target-bpw chooses other tiers")
    return (f"warning: {os.path.basename(allocation.path)} is a {name} file, but at threshold {allocation.threshold:g} "
            f"bits per weight every linear maps to int8 (a type at or above the threshold is int8): {fix}")


def allocate_stage(opened: Opened, src: Source, recipe: Recipe, inputs: Inputs, run: RunOptions) -> Allocated:
    """The oracle's tiers, or the tiers :func:`orkpy.quantization.alloc.target_allocation` chooses for
    ``allocation.target_bpw``, or :func:`orkpy.quantization.npu_alloc.npu_allocation` for
    ``allocation.npu_bits`` (sensitivities measured on the transformed source)."""
    if opened.tiers is not None and opened.allocation is not None:
        note = four_bit_oracle_note(opened.allocation, opened.tiers)
        if note:
            run.log(note)
        return Allocated(opened.tiers, opened.allocation, None)
    a = recipe.allocation
    if a.npu_bits is not None:
        from .npu_alloc import npu_allocation
        assert inputs.calib is not None  # Recipe.check_inputs
        tm, report = npu_allocation(src, inputs.calib, a.npu_bits, recipe.activation, a.target_ctx, a.target_chunks,
                                    run.threads, run.progress, a.npu_options, a.npu_per_linear,
                                    recipe.rounding.symmetric)
        split = sum(1 for v in report["groups"].values() if "/" in v)
        run.log(f"npu_bits {a.npu_bits:g}: {report['npu_bpw']:.3f} NPU bits per weight "
                f"({report['npu_bytes'] / 1e6:.2f} MB per token); linears: "
                + ", ".join(f"{t} {sum(1 for v in report['tiers'].values() if v == t)}" for t in a.npu_options)
                + f" ({len(report['groups'])} input groups, {split} of them split between tiers)")
        return Allocated(tm, read_allocation(tm, a.threshold), report)
    from .alloc import DEFAULT_OPTIONS, target_allocation
    assert a.target_bpw is not None and inputs.calib is not None  # Recipe.check_inputs
    tm, report = target_allocation(src, inputs.calib, a.target_bpw, tuple(a.target_options or DEFAULT_OPTIONS), a.kind,
                                   inputs.imatrix, a.target_ctx, a.target_chunks, run.threads, run.progress,
                                   method=a.target_sensitivity)
    counts: Dict[str, int] = {}
    for t in report["tiers"].values():
        counts[t] = counts.get(t, 0) + 1
    run.log(f"target_bpw {a.target_bpw:g}: {report['bpw']:.3f} bits per linear weight, "
            + ", ".join(f"{t}: {c}" for t, c in sorted(counts.items())))
    return Allocated(tm, read_allocation(tm, a.threshold), report)


def plan_linears(names: List[str], tm: TierMap, allocation: AllocationSpec) -> Dict[str, LinearPlan]:
    """Every linear's :class:`LinearPlan`, in ``names``' order: its tier in ``tm`` (the int4 tier
    on ``allocation.kind``), ``allocation.group_size`` for a packed tier that names no group."""
    plan = {}
    for name in names:
        tier = tm.linear_tier(name)
        qkind = tier_path(tier, allocation.kind)
        if qkind != "gguf" and split_tier(tier)[1] == 0 and allocation.group_size:
            tier = grouped_tier(tier, allocation.group_size)
        plan[name] = LinearPlan(tier, qkind, split_tier(tier)[1] or None)
    return plan


def round_linears(src: Source, plan: Dict[str, LinearPlan], rounding: RoundingSpec, imatrix: Optional["Imatrix"],
                  columns: Dict[str, NDArray[Any]], gq: Dict[str, QuantizedTensor],
                  threads: Optional[int]) -> Iterator[Rounded]:
    """Every linear of ``plan``, in order, rounded and packed (GPTQ's results in ``gq`` packed and
    dropped); float-tier linears pass as ``packed=None``. One float32 buffer serves every weight
    read, and nothing of a linear is held once the consumer moves on."""
    scratch = np.empty(0, np.float32)
    shapes = src.shapes()  # (a copy per call: read once)
    for name, p in plan.items():
        if p.kind == "gguf":  # the float tier: the linear stays float
            yield Rounded(name, p.tier, None, False)
            continue
        if name in gq:
            pw = pack(gq.pop(name))
            yield Rounded(name, p.tier, pw, False)
            del pw
            continue
        w: NDArray[Any]
        w16 = src.linear_stored(name)  # float16 as stored: quantize converts each row on its threads
        if w16 is not None:
            w = w16
        else:
            shape = shapes[src.tensor_name(name)]
            if scratch.size < shape[0] * shape[1]:  # one float32 buffer for every linear: no fresh pages each
                scratch = np.empty(shape[0] * shape[1], np.float32)
            w = src.linear(name, scratch=scratch[:shape[0] * shape[1]].reshape(shape))
        del w16
        q = round_linear(w, p, rounding, importance(imatrix, name, columns.get(name), w.shape[1]), threads)
        del w
        pw = pack(q)
        del q
        yield Rounded(name, p.tier, pw, True)
        del pw


def write_linears(rounded: Iterable[Rounded], writer: Optional[ModelDirWriter], src: Source,
                  tick: Callable[[], None]) -> Tuple[Dict[str, PackedWeight], Dict[str, str]]:
    """({name: packed weight}, {name: tier}) of the rounded linears. With a ``writer``
    (streaming), each is saved into the model directory as it comes -- on the writer's thread
    while the next one is rounded -- and then held only as a mapping of its file, the source's
    pages released; ``tick`` after each linear."""
    tensors: Dict[str, PackedWeight] = {}
    tiers: Dict[str, str] = {}
    for r in rounded:
        tiers[r.name] = r.tier
        if r.packed is not None:
            tensors[r.name] = r.packed
            if writer is not None and r.streamed:  # the packed bytes go to disk, the source's pages to the kernel
                writer.add_later(r.name, r.packed, r.tier, functools.partial(tensors.__setitem__, r.name))
                src.release()
            elif writer is not None:
                tensors[r.name] = writer.add(r.name, r.packed, r.tier)
        del r  # the loop variable would hold the packed weight while the next linear is rounded
        tick()
    if writer is not None:
        writer.wait()  # every linear now maps its file
    return tensors, tiers


def quantize_stage(src: Source, plan: Dict[str, LinearPlan], recipe: Recipe, inputs: Inputs,
                   run: RunOptions, writer: Optional[ModelDirWriter],
                   checkpoint_of: Optional[StrPath]) -> Tuple[Dict[str, PackedWeight], Dict[str, str],
                                                              Optional[ActCalibration], Any]:
    """(packed linears, tiers, activation ranges or None, the LayerwiseRun or None): every linear
    rounded and written. With a calibration text, layer by layer (:mod:`orkpy.quantization.layerwise`:
    GPTQ when the recipe says so, AWQ's scales searched and folded in block by block
    (``rounding.awq``; the run's ``src`` is then the scaled source, which the model directory's
    float tensors come from), the activation ranges; ``checkpoint_of``: the output folder whose
    checkpoint makes the run resumable); without, each linear rounded as it is read."""
    if inputs.calib is not None:
        from .layerwise import CHECKPOINT_SUFFIX, LayerwiseRun
        awq = None
        if recipe.rounding.awq:
            from .awq import LayerAwq
            c = recipe.calibration
            awq = LayerAwq(src, {n: p.kind for n, p in plan.items()}, c.ctx, 0)  # chunks: the run's
        lw = LayerwiseRun(src, plan, recipe, inputs.calib, inputs.imatrix, {}, run,
                          gptq=recipe.rounding.method == "gptq", acts=True,
                          checkpoint=None if checkpoint_of is None else
                          os.path.abspath(os.fspath(checkpoint_of)) + CHECKPOINT_SUFFIX, awq=awq)
        tensors, tiers = write_linears(lw, writer, src, lambda: None)
        if awq is not None:
            run.log(awq.summary())
        act = lw.act_calibration
        run.log(f"calibrated the activations of {len(act or ())} linears on {len(lw.chunks)} chunks of "
                f"{recipe.calibration.ctx} tokens")
        return tensors, tiers, act, lw
    bar = progress_bar(len(plan), "quantize", run.progress, "tensor")
    tensors, tiers = write_linears(round_linears(src, plan, recipe.rounding, inputs.imatrix, {}, {}, run.threads),
                                   writer, src, bar.update if bar is not None else (lambda: None))
    if bar is not None:
        bar.close()
    return tensors, tiers, None, None


def manifest_settings(recipe: Recipe, src: Source, imatrix: Optional["Imatrix"],
                      tensors: Dict[str, PackedWeight]) -> Dict[str, Any]:
    """The manifest's ``settings`` (what loading a model directory reads: the transform, the tied
    lookup), as orkpy wrote them before recipes: keys that are new since appear only when used."""
    from .gptq import DEFAULT_BLOCK, DEFAULT_DAMP
    t, c, a, r = recipe.transform, recipe.calibration, recipe.allocation, recipe.rounding
    settings: Dict[str, Any] = {
        "kind": a.kind, "sr": r.sr, "seed": r.seed, "threshold": a.threshold,
        "clip_grid": None if r.clip_grid is None else list(r.clip_grid),
        "rotate": t.rotate, "rotate_seed": t.rotate_seed if (t.rotate is not None or t.rotate_online) else None,
        "rotate_online": t.rotate_online, "smooth": t.smooth,
        "gptq": {"damp": DEFAULT_DAMP, "block": DEFAULT_BLOCK, "n_ctx": c.ctx, "chunks": c.chunks,
                 **({"sequential": True} if r.gptq_sequential else {}),
                 **({"precision": r.gptq_precision} if r.gptq_precision != "float64" else {})}
        if r.method == "gptq" else None,
        "transform": src.info() if isinstance(src, TransformedSource) else None}
    if r.awq:  # only then: without it the manifest stays byte-identical to earlier releases
        settings["awq"] = True
    if a.group_size:
        settings["group_size"] = a.group_size
    if imatrix is not None or r.clip_search != "screen":  # the search that chose the 4-bit scales
        settings["clip_search"] = r.clip_search
    if a.target_bpw is not None:
        settings["target_bpw"] = a.target_bpw
    if a.tied_lookup == "packed" and src.tied and OUTPUT in tensors:  # only then: otherwise nothing changes
        settings["tied_lookup"] = "packed"
    return settings


__all__ = ["Allocated", "Inputs", "LinearPlan", "Opened", "Rounded", "RunOptions", "allocate_stage",
           "importance", "manifest_settings", "open_stage", "plan_linears", "quantize_stage", "round_linear",
           "round_linears", "transform_stage", "write_linears"]
