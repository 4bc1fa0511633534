"""Allocation to a budget of NPU weight bytes per token: W4A4, W4A8 (int8 activations as two int4
digits) or W8A8 per input group, chosen by measured sensitivity (docs/w4a4.md).

On the RK3588 the NPU reads every weight of every linear once per decoded token, and reads what its
multiplier takes: int8 for every 8-bit-activation tier (int8; int4 codebooks, int5 and int6 are
inflated to int8 in NPU memory), 4 bits for ``w4a4`` and ``w4a8`` (the int4 x int4 -> int16 mode;
w4a8 runs each int8 activation as two int4 digits, two rows per token). So the cost
that matters is :func:`npu_nbytes` (``orkpy.formats.tiermap.NPU_BITS``), not the file's bytes, and
``npu_bits`` is the average NPU bits per weight of the packed linears (4: every linear W4A4; 8:
every linear W8A8).

The unit of choice is an *input group*: the linears that read one input (a block's ``attn_q`` /
``attn_k`` / ``attn_v``; ``ffn_gate`` / ``ffn_up``; ``attn_output``, ``ffn_down`` and the head
alone): they share one activation quantization, and on the NPU one chained job. The tiers with int8
activations (w4a8 and int8) quantize that input alike, so with ``per_linear`` they are measured and
chosen per linear inside a group (``attn_v`` at W8A8 while ``attn_q`` / ``attn_k`` stay W4A8, as
llama.cpp's Q4_K_M spends its bits on ``attn_v``); W4A4 is one choice per group.

Sensitivity (:func:`group_sensitivities`): the model with every group at the high option (W8A8),
and for each group and each low option in turn that group alone at the option (its linears swapped in with
:meth:`orkpy.Model.swap_linear`): the mean KL divergence of its next-token distributions against
the float model's on ``chunks`` chunks of calibration text, less the high model's own. One forward
pass per group and low option (SmolLM2-135M: 121 groups; per linear, w4a8 one per linear: 211),
measured end to end, so the activations' error and the weights' both count. The choice (:func:`choose_npu`) is the multiple-choice knapsack of
:func:`orkpy.quantization.alloc.choose` on (NPU bytes, measured KL increase): upgrades to W8A8
taken greedily by KL saved per NPU byte while the budget allows.

The 4-bit options may carry group-wise weight scales (``"w4a8-g32"``, :func:`check_options`): the
same codes and NPU weight bytes, one scale per group of inputs (on the NPU each group one int4 K tile,
scaled on the host); measured and chosen like the per-channel ones.
"""
from __future__ import annotations

import itertools
import math
import re
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from numpy.typing import NDArray

from .._io import progress_bar
from ..formats.tiermap import NPU_BITS, TIER_ACT_BITS, split_tier
from .alloc import _log_softmax, choose, mean_kl

#: the tiers an NPU allocation chooses from, the high one last: w4a4 (4-bit activations) and w4a8 (int8
#: activations as two int4 digits) at 4 NPU bits per weight, int8 (W8A8) at 8
NPU_OPTIONS = ("w4a4", "w4a8", "int8")
#: the default of npu_allocation's ``per_linear``: the int8-activation options measured and chosen per
#: linear inside an input group (module doc)
PER_LINEAR = True
_GROUP = re.compile(r"^(blk\.\d+\.)(attn_q|attn_k|attn_v|ffn_gate|ffn_up)(\.weight)$")
_GROUP_OF = {"attn_q": "attn_qkv", "attn_k": "attn_qkv", "attn_v": "attn_qkv", "ffn_gate": "ffn_gate_up",
             "ffn_up": "ffn_gate_up"}


def npu_nbytes(tier: str, N: int, K: int) -> int:
    """Weight bytes the NPU reads per token for an (N, K) linear at ``tier``: N and K padded to the
    NPU's alignment (32; N to 64 in the int4 mode) times the tier's NPU bits (8, or 4 for w4a4); a
    float linear runs on the host (0). The per-channel scales stay with the host's output scaling."""
    base = split_tier(tier)[0]
    bits = NPU_BITS[base]
    if bits == 0:
        return 0
    Np = -(-N // (64 if bits == 4 else 32)) * (64 if bits == 4 else 32)
    Kp = -(-K // 32) * 32
    return Np * Kp * bits // 8


def input_group(name: str) -> str:
    """The input group of a linear (see module doc): ``blk.3.attn_qkv.weight`` for q / k / v, ..."""
    m = _GROUP.match(name)
    return f"{m.group(1)}{_GROUP_OF[m.group(2)]}{m.group(3)}" if m else name


def input_groups(names: Sequence[str]) -> Dict[str, List[str]]:
    """{group: its linears}, groups in the order of their first linear."""
    out: Dict[str, List[str]] = {}
    for n in names:
        out.setdefault(input_group(n), []).append(n)
    return out


def npu_budget(shapes: Mapping[str, Tuple[int, int]], npu_bits: float) -> int:
    """NPU bytes per token of ``shapes`` ({linear: (N, K)}) at ``npu_bits`` bits per weight on
    average: the W8A8 bytes (padding included) times ``npu_bits / 8``."""
    if isinstance(npu_bits, bool) or not isinstance(npu_bits, (int, float)) or not math.isfinite(npu_bits) \
            or not 4 <= npu_bits <= 8:
        raise ValueError(f"npu_bits must be a number of NPU bits per weight in [4, 8] (4: every linear W4A4, 8: "
                         f"every linear W8A8), got {npu_bits!r}")
    full = sum(npu_nbytes("int8", N, K) for N, K in shapes.values())
    return int(full * float(npu_bits) / 8)


def _acts8(tier: str) -> bool:
    """Whether a tier's linears multiply int8 activations (int8, w4a8): such tiers share one activation
    quantization, so the linears of one input group may take different ones of them."""
    return TIER_ACT_BITS[split_tier(tier)[0]] == 8


def group_sensitivities(hi: Any, lo: Mapping[str, Mapping[str, Any]], batch: Sequence[NDArray[Any]],
                        ref_logp: Sequence[NDArray[np.float64]], threads: Optional[int] = None,
                        progress: bool = True, per_linear: bool = False) -> Dict[str, Any]:
    """{"base": the high model's mean KL, "kl": {option: {unit: KL increase with that unit at the
    option}}} (module doc). ``hi``: an :class:`orkpy.Model` with every linear at the high option;
    ``lo``: {option: {linear: LinearSpec at that option}}; ``batch``: the calibration chunks;
    ``ref_logp``: the float model's log-probabilities on them. The units are the input groups, one
    forward pass per group and option; with ``per_linear``, an option with int8 activations (w4a8: the
    activation quantization of the high option, int8) is measured on each linear of a group alone
    (keyed by the linear's name), so that :func:`choose_npu` may mix it with int8 inside a group."""
    groups = input_groups([n for n in hi.linears if all(n in specs for specs in lo.values())])
    split = {t: per_linear and _acts8(t) for t in lo}
    base = mean_kl(ref_logp, [hi.forward(c, threads=threads) for c in batch])
    out: Dict[str, Dict[str, float]] = {t: {} for t in lo}
    passes = sum(len(m) if split[t] else 1 for m in groups.values() for t in lo)
    bar = progress_bar(passes, "npu-sensitivity", progress, "pass")
    try:
        for g, members in groups.items():
            for t, specs in lo.items():  # a group's options in turn (GroupSpecs keeps one group's stores)
                for unit in ([[n] for n in members] if split[t] else [members]):
                    old = {n: hi.swap_linear(n, specs[n]) for n in unit}
                    try:
                        kl = mean_kl(ref_logp, [hi.forward(c, threads=threads) for c in batch])
                    finally:
                        for n in unit:
                            hi.swap_linear(n, old[n])
                    out[t][unit[0] if split[t] else g] = max(kl - base, 0.0)
                    if bar is not None:
                        bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return {"base": base, "kl": out}


class GroupSpecs(Mapping[str, Any]):
    """{linear: its LinearSpec at one option}, made on use by ``make(name, tier)``, which keeps its
    packed stores in ``cache``; asking for a linear of another input group first empties ``cache``
    (shared by the options of one allocation, so w4a4 and w4a8 of one linear share their codes).
    :func:`group_sensitivities` reads the options group by group, so an allocation holds the high
    model and one group's low options, not every linear at every option."""

    def __init__(self, names: Sequence[str], tier: str, make: Callable[[str, str], Any], cache: Dict[str, Any]):
        self._names, self._tier, self._make, self._cache = list(names), tier, make, cache
        self._set = frozenset(self._names)

    def __getitem__(self, name: str) -> Any:
        if name not in self._set:
            raise KeyError(name)
        g = input_group(name)
        if self._cache.get("group") != g:
            self._cache.clear()
            self._cache["group"] = g
        return self._make(name, self._tier)

    def __contains__(self, name: object) -> bool:
        return name in self._set

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def choose_npu(shapes: Mapping[str, Tuple[int, int]], kl: Mapping[str, Mapping[str, float]], npu_bits: float,
               options: Sequence[str] = NPU_OPTIONS) -> Tuple[Dict[str, str], Dict[str, Any]]:
    """({linear: tier}, report): every group at one of ``options`` (the last, the high one, at an
    estimated KL of 0; each other at ``kl[option][group]``), at most ``npu_budget(shapes, npu_bits)`` NPU
    bytes per token at the least summed KL (at 4 bits: the cheapest options, whatever their padding).
    Where ``kl`` holds the int8-activation options (w4a8) per linear (``group_sensitivities(per_linear=
    True)``), a group's linears may take different ones of them and int8 (their KL increases summed, the
    group's choice reported as the linears' tiers joined by "/"); w4a4 stays one choice per group (its
    linears share one 4-bit activation quantization).
    The report: budget, bytes, NPU bits per weight, the estimate and each group's choice. NPU bits per
    weight (``npu_bpw``) are 8 x the NPU bytes over the W8A8 bytes of the same linears (both padded as
    the NPU stores them)."""
    hi = options[-1]
    budget = npu_budget(shapes, npu_bits)
    groups = input_groups(list(shapes))
    a8 = [t for t in options if _acts8(t)]  # the options that may differ between one group's linears
    costs: Dict[str, Dict[str, Tuple[int, float]]] = {}
    for g, members in groups.items():
        c: Dict[str, Tuple[int, float]] = {}
        per = len(members) > 1 and all(n in kl[t] for t in a8 if t != hi for n in members)
        for t in options:
            if not (per and t in a8):
                c[t] = (sum(npu_nbytes(t, *shapes[n]) for n in members), 0.0 if t == hi else float(kl[t].get(g, 0.0)))
        if per:  # every combination of the int8-activation options over the group's linears
            for combo in itertools.product(a8, repeat=len(members)):
                c["/".join(combo) if len(set(combo)) > 1 else combo[0]] = (
                    sum(npu_nbytes(t, *shapes[n]) for t, n in zip(combo, members)),
                    sum(0.0 if t == hi else float(kl[t][n]) for t, n in zip(combo, members)))
        costs[g] = c
    cheapest = sum(min(b for b, _ in c.values()) for c in costs.values())
    pick = choose(costs, max(budget, cheapest) if npu_bits <= 4 else budget)
    tiers = {n: t for g, members in groups.items() for n, t in zip(members, _member_tiers(pick[g], len(members)))}
    nbytes = sum(costs[g][pick[g]][0] for g in groups)
    full = sum(npu_nbytes("int8", N, K) for N, K in shapes.values())
    rep = {"npu_bits": float(npu_bits), "options": list(options), "budget": budget, "npu_bytes": nbytes,
           "npu_bpw": 8.0 * nbytes / max(full, 1), "estimate": sum(costs[g][pick[g]][1] for g in groups),
           "groups": pick, "kl": {t: {g: float(v) for g, v in kl[t].items()} for t in options if t != hi}}
    return tiers, rep


def _member_tiers(choice: str, n: int) -> List[str]:
    """The tiers of a group's ``n`` linears from its choice: one tier for all, or one per linear joined by "/"."""
    parts = choice.split("/")
    return parts if len(parts) == n else [choice] * n


def npu_allocation(src: Any, calib: Any, npu_bits: float, act: Any = None, n_ctx: int = 256, chunks: int = 2,
                   threads: Optional[int] = None, progress: bool = True,
                   options: Sequence[str] = NPU_OPTIONS, per_linear: bool = PER_LINEAR,
                   symmetric: bool = True) -> Tuple[Any, Dict[str, Any]]:
    """(TierMap, report): one of ``options`` (default W4A4 / W4A8 / W8A8) for every linear of ``src`` (a
    Source, already transformed) at ``npu_bits`` NPU bits per weight (module doc). The sensitivities are
    measured with round-to-nearest weights of every option in the activation spec ``act`` (default per
    token) on ``chunks`` chunks of ``n_ctx`` tokens of ``calib`` (w4a4 and w4a8 share one packed store:
    the same codes); 8, and 4 with one 4-bit option, need no measurement. ``per_linear``: w4a8 measured
    and chosen per linear inside an input group (module doc; more passes: one per linear, not per
    group). ``symmetric=False``: the grouped int4 options are measured with affine groups
    (csrc/ork/affine.h), as ``rounding.symmetric=False`` rounds them. The arguments are checked first."""
    from ..formats.tiermap import EMBEDDING, TierEntry, TierMap
    from ..kernels.actspec import ActSpec
    from ..kernels.packed import pack
    from ..kernels.quant import KIND_INFO, quantize
    from ..runtime.actcal import calibrate_activations, resolve
    from ..runtime.model import LinearSpec, build_model, calib_chunks, float_model, linear_names

    names = list(linear_names(src.hp))
    all_shapes = src.shapes()
    shapes = {n: (int(all_shapes[src.tensor_name(n)][0]), int(all_shapes[src.tensor_name(n)][1])) for n in names}
    npu_budget(shapes, npu_bits)  # the argument's checks, before any work
    options = check_options(options)
    spec = ActSpec() if act is None else act
    sens: Dict[str, Any] = {"base": None, "kl": {t: {} for t in options[:-1]}, "n_ctx": int(n_ctx), "chunks": 0}
    low = list(options[:-1])
    if npu_bits < 8 and (len(low) > 1 or npu_bits > 4):  # else nothing to choose: no measurement
        batch, _ = calib_chunks(src, calib, n_ctx, chunks)
        n_chunk = len(batch)
        ref_lp = streamed_logprobs(src, batch, threads)  # one layer's float32 weights at a time
        cal = None
        if spec.info.calibrated:  # static ranges: calibrated on the float model (whole, as before)
            fm = float_model(src)
            cal = calibrate_activations(fm, calib, n_ctx=n_ctx, chunks=chunks, threads=threads, progress=False)
            del fm
        where = "npu_bits allocation"

        stores: Dict[str, Any] = {}

        def spec_of(n: str, tier: str) -> Any:
            kind, g = split_tier(tier)
            key = f"{n}:{KIND_INFO[kind].store_bits}:{g}"  # w4a4 and w4a8: the same codes, one store
            if key not in stores:
                K = int(shapes[n][1])
                aff = not symmetric and KIND_INFO[kind].bits == 8 and KIND_INFO[kind].qmax == 7 and 0 < g < K
                stores[key] = pack(quantize(src.linear(n), kind, threads=threads, group_size=g or None,
                                            symmetric=not aff))
                src.release(caches=False)  # the source's pages: one tensor at a time
            pw = stores[key]
            return LinearSpec.from_packed(n, pw.as_kind(kind), act_spec=resolve(spec, n, cal, pw.K, where, kind, pw.group))
        hi = build_model(src, lambda n: (spec_of(n, options[-1]), options[-1]))
        src.release()
        stores.clear()  # the high model holds its own; the low options' stores one input group at a time
        lo = {t: GroupSpecs(names, t, spec_of, stores) for t in low}
        sens = dict(group_sensitivities(hi, lo, batch, ref_lp, threads, progress, per_linear), n_ctx=int(n_ctx), chunks=n_chunk)
        del hi, lo, stores
    tiers, rep = choose_npu(shapes, sens["kl"], npu_bits, options)
    entries: Dict[str, TierEntry] = {}
    for n in names:
        t = src.tensor_name(n)
        entries[t] = TierEntry(tiers[n], src.type_of(t), tuple(int(d) for d in all_shapes[t]))
    if EMBEDDING in all_shapes and EMBEDDING not in entries:
        entries[EMBEDDING] = TierEntry("float", src.type_of(EMBEDDING), tuple(int(d) for d in all_shapes[EMBEDDING]))
    tm = TierMap(entries, source=f"npu_bits={float(npu_bits):g}", tied=bool(src.tied))
    rep.update({"tiers": tiers, "sensitivity": sens})
    return tm, rep


def _npu_tier(t: object) -> bool:
    """Whether ``t`` is an NPU allocation's tier: one of NPU_OPTIONS, the 4-bit ones also with a group size
    (``w4a8-g32``: group-wise scales, each group one int4 K tile, orkpy.formats.tiermap.split_tier)."""
    try:
        base, g = split_tier(t)  # type: ignore[arg-type]
    except (ValueError, TypeError):
        return False
    return base in NPU_OPTIONS and (g == 0 or base != "int8")


def check_options(options: Sequence[str]) -> Tuple[str, ...]:
    """The options of an NPU allocation: NPU tiers (w4a4, w4a8, int8; w4a4 / w4a8 also with group-wise
    scales, e.g. ``w4a8-g32``), distinct, the last one int8 (the high option every group is measured
    against); ValueError naming what is wrong."""
    opts = tuple(options)
    bad = [t for t in opts if not _npu_tier(t)]
    if bad or len(set(opts)) != len(opts) or len(opts) < 2 or opts[-1] != "int8" or "int8" in opts[:-1]:
        raise ValueError(f"npu_options must be distinct tiers among {', '.join(NPU_OPTIONS)} (the 4-bit ones also "
                         f"with a group size: 'w4a8-g32', a multiple of 32 up to 480), int8 last and at least one "
                         f"4-bit tier before it, got {list(opts)}")
    return opts


def reference_logprobs(model: Any, batch: Sequence[NDArray[Any]], threads: Optional[int] = None
                       ) -> List[NDArray[np.float64]]:
    """The log-probabilities of ``model`` (the float model) on each chunk of ``batch``."""
    return [_log_softmax(model.forward(c, threads=threads)) for c in batch]


def streamed_logprobs(src: Any, batch: Sequence[NDArray[Any]], threads: Optional[int] = None,
                      head_block_bytes: int = 64 << 20) -> List[NDArray[np.float64]]:
    """The float model's log-probabilities on each chunk of ``batch``, computed layer by layer from
    ``src`` (:class:`orkpy.runtime.blocks.Stream`: one layer's float32 weights in memory, the head
    ``head_block_bytes`` of float32 rows at a time) rather than from the model's float32 copy:
    :func:`reference_logprobs` of the float model, up to the order of the head's blocks."""
    from ..formats.tiermap import OUTPUT
    from ..runtime.blocks import Block, Stream, head_blocks, layer_linears
    from ..runtime.linear import LinearSpec
    stream = Stream(src, batch)
    blk = None
    for layer in range(int(src.hp["n_layer"])):
        blk = Block(src, layer, {n: LinearSpec.f32(n, src.linear(n)) for n in layer_linears(layer)})
        blk.run(stream, threads)
        src.release()
    assert blk is not None, "a model without layers"
    N = int(src.shapes()[src.tensor_name(OUTPUT)][0])
    logits = [np.empty((x.shape[0], N), np.float32) for x in stream.xs]
    for rows, w, b in head_blocks(src, head_block_bytes):
        for out, z in zip(logits, blk.head_logits(stream, w, b, threads)):
            out[:, rows] = z
    return [_log_softmax(z) for z in logits]


__all__ = ["GroupSpecs", "NPU_OPTIONS", "PER_LINEAR", "check_options", "choose_npu", "group_sensitivities", "input_group", "input_groups", "npu_allocation",
           "npu_budget",
           "npu_nbytes", "reference_logprobs", "streamed_logprobs"]
