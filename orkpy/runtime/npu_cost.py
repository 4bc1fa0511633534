"""The per-token cost model of decode on the RK3588 NPU: an ESTIMATE built on the planner
(:func:`orkpy.runtime.npu.chain_plan`: the tasks and bytes every submit moves) and on named,
switchable assumptions about what the NPU and its drivers allow. Nothing here is measured: no
board was available; docs/npu.md ("The token's cost") lists the facts each assumption rests on.

A token at decode (M = 1) is the model's linears in forward order, grouped as the data
dependencies require -- per layer q / k / v (one input), o, gate / up (one input), down, then the
head -- with host operations between them: attention (with RoPE and Qwen3's q / k norms) after
q / k / v, residual + RMSNorm after o and after down, SwiGLU after gate / up, the final norm before
the head, sampling at the end. A host operation is a round trip, i.e. a submit boundary, unless an
assumption moves it onto the NPU. Each linear has a precision (a *precision map*, tensor name ->
"int8" (W8A8), "w4a4" (int4 x int4 -> int16 K tiles of <= 480 codes, summed in int32), "w4a8" (the same
int4 weights, each int8 activation two int4 digits: two rows per token) or "float"
(not on the NPU: a host round trip around its group, its own cost not modelled)).

    ms / token = bytes / bandwidth                      (weights + packed inputs + outputs + commands)
               + submits x (submit_ms - hidden)         (hidden = async_hidden_ms with async_submit)
               + tasks x task_us / cores

Assumptions (:class:`Assumptions`, every field printed with the estimate by :func:`describe`):

  bandwidth_gbs    DRAM bandwidth the weights stream at (33.8 = LPDDR4x-4224 x 64 bit, theoretical;
                   25.8 = what RKLLM's published Qwen2.5-1.5B w8a8 speed implies at least)
  submit_ms        one submit's round trip (0.218 ms: a tiny vendor-driver submit, measured publicly)
  task_us          extra cost of each task inside a chain (unknown: 0 unless given)
  chain_jobs       the matmuls between two host round trips run as ONE chained submit (Device.job;
                   tested through the emulator); off: one submit per matmul (Device.matmul today)
  async_submit     the host's part of submit i + 1 overlaps the NPU running submit i (NONBLOCK +
                   fence-in); ``async_hidden_ms`` of each submit is hidden (no public source splits
                   the 0.218 ms into host and NPU/IRQ latency: half is assumed)
  out_cvt          the DPU's output converter requantizes a matmul's output to int8 on the NPU (the
                   int4 K tiles accumulated on chip first); outputs written as M x N int8
  resident_acts    activations stay in NPU memory between tasks (no host copy in between)
  npu_elementwise  RMSNorm, residual adds and SwiGLU run on the NPU (DPU / PPU) inside the chain
                   (needs out_cvt and resident_acts): only attention stays a host round trip
  npu_attention    attention (RoPE, q / k norm, softmax over the KV cache) runs on the NPU too (needs
                   npu_elementwise): one submit per token
  cores            each matmul's N split over this many NPU cores as independent jobs of one submit:
                   bandwidth is shared (bytes time unchanged), per-task cost divided, the round trip
                   unchanged (the submit completes when its last core does)

A submit of more than 4095 tasks counts ceil(tasks / 4095) submits (the vendor driver's limit per
hardware commit, which the rknpu backend follows).
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..formats import tiermap
from . import npu

#: Published configs (hidden, ffn, layers, heads, kv heads, head_dim, vocab; tied heads): the decode
#: shapes of the models the bench reports.
MODELS: Dict[str, Dict] = {
    "qwen3-1.7b": dict(hidden=2048, ffn=6144, layers=28, n_head=16, n_head_kv=8, head_dim=128, vocab=151936,
                       tied=True),
    "qwen2.5-1.5b": dict(hidden=1536, ffn=8960, layers=28, n_head=12, n_head_kv=2, head_dim=128, vocab=151936,
                         tied=True),
    "smollm2-135m": dict(hidden=576, ffn=1536, layers=30, n_head=9, n_head_kv=3, head_dim=64, vocab=49152,
                         tied=True),
    "gemma3-270m": dict(hidden=640, ffn=2048, layers=18, n_head=4, n_head_kv=1, head_dim=256, vocab=262144,
                        tied=True),
}
#: A layer's groups of linears, in forward order; the members of one group read the same input.
LAYER_GROUPS = (("attn_q", "attn_k", "attn_v"), ("attn_output",), ("ffn_gate", "ffn_up"), ("ffn_down",))
#: The host operation after each group (then "final_norm" before the head instead of the last "norm").
AFTER_GROUP = ("attention", "norm", "swiglu", "norm")
HEAD = "output.weight"
PRECISIONS = ("int8", "w4a4", "w4a8", "float")
#: int4 precisions with group-wise weight scales: "w4a4-g128", "w4a8-g32" (one float scale per G weights of
#: a row; G a multiple of 32 up to npu.INT4_MAX_KT). On the NPU each group is its own K tile (the planner's
#: max_k = G), whose int16 block the host scales by the group's scale before adding: the weight bytes of the
#: per-channel precision, K / G tiles and int16 output blocks per matmul instead of K / 480, and the output
#: comes back to the host (a round trip after its group even where norms or SwiGLU are assumed on the NPU)
GROUPED = ("w4a4", "w4a8")
BITS = {"int8": 8, "w4a4": 4, "w4a8": 4}
#: activation rows per token of a precision: w4a8 runs each int8 activation as two int4 digits (two rows)
ROWS = {"int8": 1, "w4a4": 1, "w4a8": 2}
MAX_TASKS_PER_SUBMIT = 4095  # the vendor driver's tasks per hardware commit (docs/npu.md, sources)


def split_precision(p) -> Tuple[str, int]:
    """(base precision, group size or 0) of a precision name (``"w4a8-g128"`` -> ("w4a8", 128)); a
    ValueError names anything else. The grouped forms are the allocation's tiers
    (orkpy.formats.tiermap.split_tier), of the precisions in :data:`GROUPED` only."""
    try:
        base, g = tiermap.split_tier(p)
    except ValueError:
        base, g = None, 0
    if base not in PRECISIONS or (g and base not in GROUPED):
        raise ValueError(f"unknown precision {p!r} (expected one of {', '.join(PRECISIONS)}, or "
                         f"{' / '.join(GROUPED)} with -gG group-wise scales, G a multiple of 32 from 32 to "
                         f"{npu.INT4_MAX_KT}: one K tile of the int4 mode)")
    return base, g


def linears(d) -> List[Tuple[str, int, int]]:
    """(tensor name, K, N) of every linear of one decoded token, in forward order (GGUF names;
    the head is ``output.weight``, the tied embedding read as the head included)."""
    h, q, kv = d["hidden"], d["n_head"] * d["head_dim"], d["n_head_kv"] * d["head_dim"]
    kn = {"attn_q": (h, q), "attn_k": (h, kv), "attn_v": (h, kv), "attn_output": (q, h), "ffn_gate": (h, d["ffn"]),
          "ffn_up": (h, d["ffn"]), "ffn_down": (d["ffn"], h)}
    out = [(f"blk.{i}.{n}.weight", *kn[n]) for i in range(d["layers"]) for g in LAYER_GROUPS for n in g]
    return out + [(HEAD, h, d["vocab"])]


def uniform_map(d, precision) -> Dict[str, str]:
    """Every linear at one precision ("int8", "w4a4", "w4a8", a grouped "w4a8-g128", or "float")."""
    split_precision(precision)
    return {name: precision for name, _, _ in linears(d)}


def npu_bits(d, pmap) -> float:
    """NPU bits per weight: the code bits of the linears on the NPU (8 for int8, 4 for w4a4) averaged
    over their weights (per-output-channel scales, 32 / K bits more, and float linears excluded)."""
    num = den = 0
    for name, K, N in linears(d):
        p = split_precision(pmap[name])[0]
        if p != "float":
            num += BITS[p] * K * N
            den += K * N
    return num / den if den else 0.0


def mix_priority(d) -> List[Tuple[str, List[str]]]:
    """The stand-in sensitivity order of :func:`mix_map` (until measured sensitivities exist): attn_v
    of every layer, the first and the last layer whole, ffn_down layer by layer, attn_output, the head,
    then the rest layer by layer."""
    L, out = d["layers"], []

    def blk(i, n):
        return f"blk.{i}.{n}.weight"

    out.append(("attn_v (every layer)", [blk(i, "attn_v") for i in range(L)]))
    out.append(("first and last layer", [blk(i, n) for i in sorted({0, L - 1}) for g in LAYER_GROUPS for n in g]))
    out += [(f"ffn_down of layer {i}", [blk(i, "ffn_down")]) for i in range(L)]
    out.append(("attn_output (every layer)", [blk(i, "attn_output") for i in range(L)]))
    out.append(("head", [HEAD]))
    out += [(f"layer {i}", [blk(i, n) for g in LAYER_GROUPS for n in g]) for i in range(L)]
    return out


def mix_map(d, budget_bits=5.0, low="w4a4") -> Tuple[Dict[str, str], List[str]]:
    """A plausible mixed map at <= ``budget_bits`` NPU bits per weight: everything ``low`` (W4A4, or W4A8
    by digits: the same bytes), then the
    items of :func:`mix_priority` upgraded to W8A8 in order while the budget allows (an item that
    does not fit is skipped, later smaller ones may). A STAND-IN until measured sensitivities exist.
    Returns the map and the labels of the items upgraded."""
    if not 4.0 <= budget_bits <= 8.0:
        raise ValueError(f"--mix budget must be in [4, 8] NPU bits per weight, got {budget_bits}")
    size = {name: K * N for name, K, N in linears(d)}
    total = sum(size.values())
    extra = (budget_bits - 4.0) * total  # bits a W8A8 weight costs over W4A4: 4
    pmap, taken = uniform_map(d, low), []
    for label, names in mix_priority(d):
        names = [n for n in names if pmap[n] == low]
        cost = 4 * sum(size[n] for n in names)
        if names and cost <= extra + 1e-9:
            extra -= cost
            for n in names:
                pmap[n] = "int8"
            taken.append(label)
    return pmap, taken


def read_alloc(path, d) -> Dict[str, str]:
    """A precision map from a JSON file {tensor name: "w4a4" | "w4a8" | "int8" | "float", or a grouped
    "w4a8-g128" ...} naming every linear
    of ``d`` (the tied head may be named ``token_embd.weight``). Unknown names, missing linears and
    other values are a ValueError naming them."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        raw = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as e:   # bad UTF-8 / JSON, an integer too long, nesting too deep
        raise ValueError(f"{path}: not valid JSON ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object {{tensor name: precision}}")
    raw = dict(raw)
    if d.get("tied") and "token_embd.weight" in raw and HEAD not in raw:
        raw[HEAD] = raw.pop("token_embd.weight")
    names = [n for n, _, _ in linears(d)]
    unknown = sorted(set(raw) - set(names))
    missing = [n for n in names if n not in raw]
    bad = sorted(f"{n}: {v!r}" for n, v in raw.items() if not _valid(v))
    problems = (("names no linear of the model has", unknown), ("misses", missing),
                ("has values other than " + " / ".join(PRECISIONS) + " (or w4a4-gG / w4a8-gG)", bad))
    for what, items in problems:
        if items:
            raise ValueError(f"{path}: {what}: {', '.join(items[:5])}{' ...' if len(items) > 5 else ''}")
    return {n: raw[n] for n in names}


def _valid(p) -> bool:
    try:
        split_precision(p)
    except ValueError:
        return False
    return True


@dataclasses.dataclass(frozen=True)
class Assumptions:
    """The cost model's switches (module doc). The defaults are today's schedule: Device.job chains
    between host round trips, 33.8 GB/s, 0.218 ms per submit, nothing else assumed."""
    bandwidth_gbs: float = 33.8
    submit_ms: float = 0.218
    task_us: float = 0.0
    chain_jobs: bool = True
    async_submit: bool = False
    async_hidden_ms: float = 0.109
    out_cvt: bool = False
    resident_acts: bool = False
    npu_elementwise: bool = False
    npu_attention: bool = False
    cores: int = 1

    def check(self):
        need = {"npu_elementwise": ("out_cvt", "resident_acts", "chain_jobs"), "npu_attention": ("npu_elementwise",)}
        for flag, reqs in need.items():
            missing = [r for r in reqs if getattr(self, flag) and not getattr(self, r)]
            if missing:
                raise ValueError(f"assumption {flag} needs {', '.join(missing)}")
        if self.cores not in (1, 2, 3):
            raise ValueError(f"cores must be 1, 2 or 3 (the RK3588 has three), got {self.cores}")
        if not self.bandwidth_gbs > 0 or self.submit_ms < 0 or self.task_us < 0 or self.async_hidden_ms < 0:
            raise ValueError("bandwidth must be > 0 and the submit / task / hidden costs >= 0")
        return self

    def on(self) -> List[str]:
        """The switched-on assumptions beyond today's schedule, by name."""
        flags = ("async_submit", "out_cvt", "resident_acts", "npu_elementwise", "npu_attention")
        out = [f for f in flags if getattr(self, f)]
        if not self.chain_jobs:
            out.insert(0, "no chain_jobs")
        return out + ([f"cores={self.cores}"] if self.cores > 1 else [])


#: What each assumption rests on: (status, source). status "measured" / "public" / "tested" (in the
#: emulator here) / "ASSUMED" (nothing public confirms it) / "unknown".
BASIS = {
    "bandwidth_gbs": ("public+inference", "LPDDR4x-4224 x 64 bit = 33.8 GB/s theoretical; RKLLM's Qwen2.5-1.5B "
                      "w8a8 16.69 tok/s x 1.54 GB implies >= 25.8 GB/s effective"),
    "submit_ms": ("measured", "one tiny vendor-driver submit, elapsed 0.218 ms (allbilly/rk3588 multicore notes)"),
    "task_us": ("unknown", "per-task cost inside a PC chain: not measured publicly; a board measures it"),
    "chain_jobs": ("tested", "PC-chained tasks in one submit (captured RKNN chains; Device.job through the "
                   "emulator and both fake kernels)"),
    "async_submit": ("ASSUMED", "RKNPU_JOB_NONBLOCK / FENCE_IN exist in the vendor UAPI; the share of the 0.218 ms "
                     "a pre-issued submit hides is not public (async_hidden_ms)"),
    "out_cvt": ("ASSUMED", "the DPU's OUT_CVT scale / shift requantizes int8 convolutions in Mesa (per tensor); "
                "per-channel requant of a matmul and on-chip accumulation of int4 K tiles are not public"),
    "resident_acts": ("ASSUMED", "a task's output buffer can be the next task's input (same NPU memory); "
                      "orkpy's jobs do not chain data yet"),
    "npu_elementwise": ("ASSUMED", "the DPU has BS/BN ALU+MUL, EW with an ERDMA operand and a LUT (register "
                        "database); no bit-exact public model of RMSNorm / SwiGLU on it (ffn_chain.h is a CPU model)"),
    "npu_attention": ("ASSUMED", "nothing public runs softmax attention over a KV cache on this NPU"),
    "cores": ("public+ASSUMED", "3 cores; under rocket independent jobs go to any core (Mesa); raw multi-core "
              "vendor submits failed publicly; RWKV N split: 83 -> 76 ms (2 cores)"),
}


def describe(a: Assumptions) -> List[Tuple[str, object, str, str]]:
    """(name, value, status, source) of every assumption, for printing next to an estimate."""
    return [(f.name, getattr(a, f.name), *BASIS.get(f.name, ("", "")))
            for f in dataclasses.fields(a) if f.name != "async_hidden_ms"] + [
        ("async_hidden_ms", a.async_hidden_ms, "ASSUMED", "half of submit_ms (no public split)")]


def segments(d, pmap, a: Assumptions) -> List[List[Tuple[str, int, int, str]]]:
    """The NPU submits of one token: lists of (name, K, N, precision) between host round trips (module doc);
    with chain_jobs off, one matmul each."""
    a.check()
    host_on_npu = {"attention": a.npu_attention, "norm": a.npu_elementwise, "swiglu": a.npu_elementwise,
                   "final_norm": a.npu_elementwise}
    kn = {name: (K, N) for name, K, N in linears(d)}
    seq: List = [("host", "token")]
    L = d["layers"]
    for i in range(L):
        for g, (group, after) in enumerate(zip(LAYER_GROUPS, AFTER_GROUP)):
            seq.append(("group", [f"blk.{i}.{n}.weight" for n in group]))
            seq.append(("host", "final_norm" if (i == L - 1 and g == 3) else after))
    seq += [("group", [HEAD]), ("host", "token")]
    out: List[List[Tuple[str, int, int, str]]] = []
    cur: List[Tuple[str, int, int, str]] = []
    combine = False  # the group before holds group-wise scales: the host combines its K tiles

    def close():
        if cur:
            out.append(list(cur))
            cur.clear()

    for kind, item in seq:
        if kind == "host":
            if combine or not host_on_npu.get(item, False):
                close()
            continue
        combine = any(split_precision(pmap[n])[1] for n in item)
        cpu = any(pmap[n] == "float" for n in item)
        if cpu:  # a float linear runs on the host: its group's input comes back, its output goes out
            close()
        for n in item:
            if pmap[n] != "float":
                cur.append((n, *kn[n], pmap[n]))
                if not a.chain_jobs:
                    close()
        if cpu:
            close()
    close()
    return out


def _segment_cost(key, a: Assumptions, chain: Callable) -> Tuple[int, int, int, int, int]:
    """(weight, input, output, command bytes, tasks) of one submit's matmuls ``key`` [(K, N, precision)]:
    one chain; with group-wise scales, each matmul planned on its own with K tiles of its group size
    (a chain's regions are its matmuls' own plans), its int16 blocks coming back whatever out_cvt says."""
    def shape(K, N, p):
        base = split_precision(p)[0]
        return (ROWS[base], K, N, "int4" if BITS[base] == 4 else "int8")

    def out_of(c, parts):
        return sum(math.ceil(N / 64) * 64 for _, N, _ in parts) if a.out_cvt else c["out_bytes"]

    if not any(split_precision(p)[1] for _, _, p in key):
        c = chain([shape(*k) for k in key])
        return sum(p["w_bytes"] for p in c["parts"]), c["in_bytes"], out_of(c, key), c["cmd_bytes"], c["n_tasks"]
    tot = [0, 0, 0, 0, 0]
    for K, N, p in key:
        g = split_precision(p)[1]
        c = chain([shape(K, N, p)], max_k=g) if g else chain([shape(K, N, p)])
        got = (c["parts"][0]["w_bytes"], c["in_bytes"], c["out_bytes"] if g else out_of(c, [(K, N, p)]),
               c["cmd_bytes"], c["n_tasks"])
        tot = [t + v for t, v in zip(tot, got)]
    return tot[0], tot[1], tot[2], tot[3], tot[4]


def token_cost(d, pmap, a: Assumptions, chain: Optional[Callable] = None) -> Dict:
    """The estimate for one decoded token of model dims ``d`` under precision map ``pmap`` and
    assumptions ``a``: bytes (w / in / out / cmd), tasks, submits, and ms / tok/s with their three
    terms (module doc). ``chain``: the planner's chain_plan (default npu.chain_plan; memoised here)."""
    if chain is None:
        chain = npu.chain_plan
    cache: Dict = {}
    tot = dict(w_bytes=0, in_bytes=0, out_bytes=0, cmd_bytes=0)
    tasks = submits = 0
    segs = segments(d, pmap, a)
    for seg in segs:
        key = tuple((K, N, p) for _, K, N, p in seg)
        if key not in cache:
            cache[key] = _segment_cost(key, a, chain)
        w, i, o, cmd, nt = cache[key]
        for k, v in zip(tot, (w, i, o, cmd)):
            tot[k] += v
        tasks += nt
        submits += math.ceil(nt / MAX_TASKS_PER_SUBMIT)
    nbytes = sum(tot.values())
    t_bytes = nbytes / (a.bandwidth_gbs * 1e9)
    hidden = min(a.async_hidden_ms, a.submit_ms) if a.async_submit else 0.0
    if hidden and submits:  # a submit can hide at most the NPU time of the one before it
        hidden = min(hidden, t_bytes * 1e3 / submits)
    t_submit = submits * (a.submit_ms - hidden) / 1e3
    t_tasks = tasks * a.task_us / 1e6 / a.cores
    secs = t_bytes + t_submit + t_tasks
    cpu = [n for n, _, _ in linears(d) if pmap[n] == "float"]
    return dict(tot, bytes=nbytes, tasks=tasks, submits=submits, t_bytes_ms=t_bytes * 1e3,
                t_submit_ms=t_submit * 1e3, t_tasks_ms=t_tasks * 1e3, ms=secs * 1e3, tok_s=1 / secs,
                bits=npu_bits(d, pmap), cpu_linears=cpu)


#: The schedules the bench reports, from today's to the best the assumptions allow: (label, fields of
#: Assumptions switched from the defaults).
SCHEDULES: Sequence[Tuple[str, Dict]] = (
    ("separate matmuls (Device.matmul today)", dict(chain_jobs=False)),
    ("Job chains between host round trips (today)", {}),
    ("today + async submit", dict(async_submit=True)),
    ("+ NPU norm/SwiGLU, out_cvt, resident acts", dict(out_cvt=True, resident_acts=True, npu_elementwise=True)),
    ("NPU norm/SwiGLU row + async submit", dict(out_cvt=True, resident_acts=True, npu_elementwise=True,
                                                async_submit=True)),
    ("+ NPU attention: one submit per token", dict(out_cvt=True, resident_acts=True, npu_elementwise=True,
                                                  npu_attention=True)),
    ("best: all of the above, 3 cores, async", dict(out_cvt=True, resident_acts=True, npu_elementwise=True,
                                                   npu_attention=True, async_submit=True, cores=3)),
)


def schedule(label_or_index, **over) -> Assumptions:
    """The Assumptions of a row of :data:`SCHEDULES` (by label or index), with ``over`` on top."""
    rows = dict(SCHEDULES)
    kw = SCHEDULES[label_or_index][1] if isinstance(label_or_index, int) else rows[label_or_index]
    return Assumptions(**{**kw, **over}).check()
