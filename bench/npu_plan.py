"""NPU decode plan for Qwen3-1.7B at M=1 (one token): the task split and the
bytes every int8 x int8 -> int32 matmul moves, the decode rate that traffic
allows at a given DRAM bandwidth (a roofline ESTIMATE, not a measurement: no
board here), next to RKLLM's published RK3588 figures, and the host cost of
planning + emitting the register commands of one token; then the token's cost
(W8A8 / W4A4 / mixed) for Qwen3-1.7B, Qwen2.5-1.5B, SmolLM2-135M and
Gemma-3-270M under the cost model's named assumptions.

    python bench/npu_plan.py [--gguf PATH] [--repeat 50] [--bandwidth 33.8 25 20] [--groups 128 32]
                             [--models qwen3-1.7b qwen2.5-1.5b smollm2-135m gemma3-270m]
                             [--mix 5.0 | --alloc FILE] [--cost-bandwidth 33.8 25.8] [--task-us 0]
                             [--sections plan roofline grouped timing submits cost]

Token cost (--sections cost; orkpy.runtime.npu_cost, docs/npu.md "The token's cost"): per model
and precision map -- W8A8 (every linear int8), W4A4 (every linear int4 x int4 -> int16, K tiles of
<= 480 codes summed in int32) and a mixed map (--alloc FILE: JSON {tensor name: "w4a4" | "int8" |
"float"}; else --mix BITS: the stand-in rule npu_cost.mix_map, W8A8 for attn_v, the first and last
layer, ffn_down, ... while the average stays <= BITS NPU bits per weight) -- the NPU bytes, tasks
and submits per token and the ESTIMATE ms / tok/s for each schedule of npu_cost.SCHEDULES, from
today's (Job chains between host round trips: Qwen3-1.7B W8A8 1724 MB/token at 33.8 GB/s + 113
submits x 0.218 ms = 75.6 ms, 13.2 tok/s) to the best the stated assumptions allow, with every
assumption's value, status and source printed, and the project's goal checked (mixed <= 5.0 NPU
bits/weight at >= 25 tok/s on the Qwen3-1.7B and Qwen2.5-1.5B shapes): which rows meet it, and the
assumptions each needs.

Bytes per matmul = weights (w_bytes) + packed input (in_bytes) + int32 output
(out_bytes) + register commands (cmd_bytes), from orkpy.runtime.npu.plan(). Only the
matmuls are counted: the KV cache, attention, norms and the embedding row are
not. Dimensions come from --gguf (default: the shared Qwen3 skeleton); a file
that names itself a skeleton is width-scaled, so only its layout (block count,
head_dim, tied output) is taken from it and the widths are Qwen3-1.7B's
published ones (hidden 2048, ffn 6144, 16/8 heads, vocab 151936).

Group-wise scales (--groups; csrc/ork/pack.h "Group-wise scales"): each matmul planned with K split
on group boundaries (plan(max_k=group)): one task per (m, n, k) tile, each K tile writing its own
int32 output block, which the host scales by its group's scales and adds (what ork_matmul_q8_grouped
computes). The table prints, for decode (M = 1) and a 512-token prefill, the extra int32 output
traffic against per-channel scales, the tasks, the host's float work, and the bandwidth-bound
ESTIMATE per token.

Planner timing: plan() + plan_commands() for every matmul of one token (each
Device.matmul re-plans and re-emits in C), best of --repeat, against a
baseline measured in the same run: numpy.copyto of one decoder layer's int8
weight bytes (what the NPU must stream per layer, copied here by the host CPU).

Submits per token (docs/npu.md, "Chained jobs and plan reuse"): separate matmuls
(one submit each, 7 per layer + lm_head) against chained jobs (Device.job: the
matmuls that read the same input in one submit: q/k/v, gate/up; o and down
alone), each with the host's planning cost per token (measured here: the first
token plans and emits every job; a reused Job plans nothing after that) and the
ESTIMATE 1 / (bytes / bandwidth + submits x 0.218 ms), next to RKLLM's
published Qwen2.5 1.5B w8a8 figure. The fused SwiGLU chain is not on the NPU
path (csrc/ork/ffn_chain.h is a CPU model), so it has no row.
"""
import argparse
import os
import time

import numpy as np

import orkpy.runtime.npu as npu
import orkpy.runtime.npu_cost as cost
from orkpy.evaluation.testing import best_time

SHARED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared")
DEFAULT_GGUF = os.path.join(SHARED, "models", "qwen3-skeleton", "qwen3-skel-tied-F16.gguf")

# Qwen3-1.7B's published config (used when the GGUF is absent or width-scaled)
QWEN3_1_7B = dict(hidden=2048, ffn=6144, layers=28, n_head=16, n_head_kv=8, head_dim=128, vocab=151936, tied=True)

# airockchip/rknn-llm v1.3.0 benchmark.md, RK3588, w8a8, seqlen 128, 64 new tokens, max CPU/NPU freq
# (docs/npu.md, "Sources of the facts"). Qwen3 1.7B itself is not in that table.
RKLLM = [("Qwen2.5 1.5B", 16.69), ("InternLM2 1.8B", 15.45), ("Qwen3-VL 2B (LLM part)", 14.98),
         ("Qwen3.5 2B", 13.59)]

BYTES = ("w_bytes", "in_bytes", "out_bytes", "cmd_bytes")
QWORDS_PER_TASK = 108  # 104 body + 4 tail
NPU_MAC_PER_CYCLE, NPU_HZ = 1024, 1.0e9  # per core, int8 (RK3588 TRM; docs/npu.md, sources)
SUBMIT_S = 0.218e-3  # one tiny submit on the vendor driver (allbilly multicore.md; docs/npu.md, sources)


#: matmuls of one layer that read the same input: one chained job each (Device.job)
SHARED_INPUT_JOBS = (("attn_q", "attn_k", "attn_v"), ("attn_output",), ("ffn_gate", "ffn_up"), ("ffn_down",))
SCHEDULES = ("separate", "shared_input")


def jobs(sh, schedule):
    """[([(K, N), ...] of one submit, submits of that kind per token)] for a schedule:
    "separate" = every matmul alone (Device.matmul today), "shared_input" =
    SHARED_INPUT_JOBS per layer chained, the lm_head alone."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r} (expected one of {', '.join(SCHEDULES)})")
    by = {name: (K, N, cnt) for name, K, N, cnt in sh}
    if schedule == "separate":
        return [([(K, N)], cnt) for _, K, N, cnt in sh]
    out = [([by[n][:2] for n in group], by[group[0]][2]) for group in SHARED_INPUT_JOBS]
    return out + [([(K, N)], cnt) for name, K, N, cnt in sh if name.startswith("lm_head")]


def submits_per_token(d, schedule="separate"):
    """NPU submits per decoded token of model dims ``d`` under a schedule (jobs())."""
    return sum(cnt for _, cnt in jobs(shapes(d), schedule))


def submit_table(d, sh, bw, repeat, t_replan):
    """The submits-per-token table (module doc); returns {schedule: row} for tests."""
    rows = {}
    print(f"ESTIMATE: submits per decoded token and tokens/s = 1 / (bytes / {bw:g} GB/s + submits x 0.218 ms) "
          f"(no board here: counts from the planner, run through the emulator only)")
    hdr = (f"  {'schedule':<44}{'submits':>8}{'tasks':>7}{'MB/token':>10}{'plan ms 1st':>13}{'later':>8}"
           f"{'ms/token':>10}{'tok/s':>8}")
    print(hdr)
    print("  " + "-" * (len(hdr) - 2))
    addrs = (0x00100000, 0x10000000, 0x30000000)
    for schedule, label in (("separate", "separate matmuls, re-planned every call"),
                            ("separate", "separate matmuls, each a reused Job"),
                            ("shared_input", "chained by shared input (q/k/v, gate/up)")):
        js = jobs(sh, schedule)
        nbytes = tasks = submits = 0
        for mm, cnt in js:
            c = npu.chain_plan([(1, K, N) for K, N in mm])
            w = sum(p["w_bytes"] for p in c["parts"])
            nbytes += (w + c["in_bytes"] + c["out_bytes"] + c["cmd_bytes"]) * cnt
            tasks += c["n_tasks"] * cnt
            submits += cnt

        def emit_token():
            for mm, cnt in js:
                for _ in range(cnt):
                    npu.chain_commands([(1, K, N) for K, N in mm], addrs[0], addrs[1], [0x20000000] * len(mm), addrs[2])
        reuse = "Job" in label or schedule != "separate"
        t_first = best_time(emit_token, repeat) if reuse else t_replan
        later = 0.0 if reuse else t_replan
        secs = nbytes / (bw * 1e9) + submits * SUBMIT_S
        rows[label] = dict(schedule=schedule, submits=submits, tasks=tasks, bytes=nbytes, plan_first_s=t_first,
                           plan_later_s=later, tok_s=1 / secs)
        print(f"  {label:<44}{submits:>8}{tasks:>7}{nbytes / 1e6:>10.1f}{t_first * 1e3:>13.3f}{later * 1e3:>8.3f}"
              f"{secs * 1e3:>10.2f}{1 / secs:>8.2f}")
    nb = rows["separate matmuls, re-planned every call"]["bytes"]
    print(f"  {'bandwidth bound (no submit cost)':<44}{'-':>8}{'':>7}{nb / 1e6:>10.1f}{'':>13}{'':>8}"
          f"{nb / (bw * 1e9) * 1e3:>10.2f}{bw * 1e9 / nb:>8.2f}")
    print(f"  {'RKLLM Qwen2.5 1.5B w8a8 (measured by Rockchip)':<44}{'':>8}{'':>7}{'':>10}{'':>13}{'':>8}"
          f"{1e3 / RKLLM[0][1]:>10.2f}{RKLLM[0][1]:>8.2f}")
    print(f"  fused SwiGLU chain (gate/up/down as one job): not on the NPU path (csrc/ork/ffn_chain.h is a CPU "
          f"model; docs/npu.md), so not counted")
    print(f"  (plan ms: host time to plan + emit one token's command buffers on this {os.uname().machine} host, "
          f"best of {repeat}; 'later' = every later token: a Job is planned once and reused, tested in "
          f"tests/test_npu_job.py; host time is not in ms/token; bytes/token = weights + packed inputs + int32 "
          f"outputs + commands; 0.218 ms per submit from allbilly/rk3588 multicore notes; {bw:g} GB/s = the "
          f"RK3588's ~34 GB/s LPDDR4x theoretical, docs/npu.md sources)")
    print()
    return rows


def model_dims(path):
    """(dims dict, description of where each came from)."""
    d = dict(QWEN3_1_7B)
    if not path or not os.path.exists(path):
        return d, f"Qwen3-1.7B published config (no GGUF at {path})"
    from orkpy.formats.gguf import GGUFFile

    g = GGUFFile(path)
    try:
        md, arch = g.metadata, g.architecture
        name = str(md.get("general.name", ""))
        f = dict(layers=int(md[f"{arch}.block_count"]), hidden=int(md[f"{arch}.embedding_length"]),
                 ffn=int(md[f"{arch}.feed_forward_length"]), n_head=int(md[f"{arch}.attention.head_count"]),
                 n_head_kv=int(md[f"{arch}.attention.head_count_kv"]))
        f["head_dim"] = int(md.get(f"{arch}.attention.key_length", f["hidden"] // f["n_head"]))
        f["vocab"] = g.tensor_info("token_embd.weight").shape[0]
        f["tied"] = "output.weight" not in g
    finally:
        g.close()
    src = os.path.relpath(path)
    if "skeleton" in name.lower():
        d.update(layers=f["layers"], head_dim=f["head_dim"], tied=f["tied"])
        widths = ", ".join(f"{k} {f[k]}" for k in ("hidden", "ffn", "n_head", "n_head_kv", "vocab"))
        return d, (f"{src} ('{name}', arch {arch}) is width-scaled ({widths}): layers, head_dim and tied "
                   f"output read from it; hidden/ffn/heads/vocab are Qwen3-1.7B's published values")
    d.update(f)
    return d, f"{src} ('{name}', arch {arch}): all dimensions read from its metadata"


def shapes(d):
    """[(name, K, N, count per token)] of the M=1 matmuls of one decode step."""
    h, q, kv = d["hidden"], d["n_head"] * d["head_dim"], d["n_head_kv"] * d["head_dim"]
    L = d["layers"]
    return [("attn_q", h, q, L), ("attn_k", h, kv, L), ("attn_v", h, kv, L), ("attn_output", q, h, L),
            ("ffn_gate", h, d["ffn"], L), ("ffn_up", h, d["ffn"], L), ("ffn_down", d["ffn"], h, L),
            ("lm_head" + (" (tied)" if d["tied"] else ""), h, d["vocab"], 1)]


def grouped_plan(sh, groups, bw, prefill=512):
    """The grouped-scale plan table (module doc); returns {(group, M): totals} for tests."""
    out = {}
    if not groups:
        return out
    print(f"Group-wise scales on the NPU: K split on group boundaries, one int32 block per K tile, combined on the "
          f"host (ESTIMATE at {bw:g} GB/s + 0.218 ms per submit; no board here)")
    hdr = (f"  {'phase':<16}{'group':>6}{'tasks':>8}{'weights MB':>12}{'out MB':>10}{'extra out':>11}"
           f"{'host MFLOP':>12}{'ms/token':>10}{'x per-ch':>10}")
    # the host's combine rate, measured here: y += (float(acc) * a) * s over a (512, 2048) block
    acc = np.ones((512, 2048), np.int32)
    sc, y = np.full(2048, 1e-3, np.float32), np.zeros((512, 2048), np.float32)
    t = best_time(lambda: np.add(y, (acc.astype(np.float32) * np.float32(0.5)) * sc, out=y), 5)
    rate = 3 * acc.size / t
    print(f"  host combine rate measured on this host ({os.uname().machine}, NumPy): {rate / 1e9:.2f} GFLOP/s; "
          f"'host ms' uses it (the RK3588's A76 cores will differ)")
    hdr = hdr + f"{'host ms':>9}"
    print(hdr)
    print("  " + "-" * (len(hdr) - 2))
    for M, phase in ((1, "decode"), (prefill, f"prefill {prefill}")):
        base = None
        for g in [0] + list(groups):
            tot = dict.fromkeys(BYTES, 0)
            tasks = calls = flops = 0
            for _, K, N, cnt in sh:
                p = npu.plan(M, K, N, max_k=g) if g else npu.plan(M, K, N)
                for k in BYTES:
                    tot[k] += p[k] * cnt
                tasks += p["n_tasks"] * cnt
                calls += cnt
                G = p["nk"] if g else 1
                flops += 3 * G * M * N * cnt  # per output: G x (two multiplies + one add), the host's combine
            total = sum(tot.values())
            secs = (total / (bw * 1e9) + calls * SUBMIT_S) / M
            if base is None:
                base = (tot["out_bytes"], secs)
            out[(g, M)] = dict(tot, tasks=tasks, flops=flops, ms_per_token=secs * 1e3,
                               host_ms_per_token=flops / M / rate * 1e3)
            print(f"  {phase:<16}{g or 'chan':>6}{tasks:>8}{tot['w_bytes'] / 1e6:>12.1f}{tot['out_bytes'] / 1e6:>10.1f}"
                  f"{(tot['out_bytes'] - base[0]) / 1e6:>10.1f}M{flops / M / 1e6:>12.1f}{secs * 1e3:>10.3f}"
                  f"{secs / base[1]:>10.2f}{flops / M / rate * 1e3:>9.3f}")
    print("  (out MB: int32 partial sums the NPU writes and the host reads, per call summed over the token's calls;"
          " host MFLOP per token; x per-ch: the estimate against one scale per output channel)")
    print()
    return out


SECTIONS = ("plan", "roofline", "grouped", "timing", "submits", "cost")
# the project's goal: mixed <= 5.0 NPU bits/weight at >= 1.5 x 16.7 (RKLLM's Qwen2.5-1.5B w8a8) = 25 tok/s, <= 40 ms
GOAL_MODELS, GOAL_BITS, GOAL_TOK_S = ("qwen3-1.7b", "qwen2.5-1.5b"), 5.0, 25.0


def precision_maps(args, name, d):
    """[(label, precision map, note)]: W8A8, W4A4 and the mixed map (--alloc FILE or the --mix rule)."""
    out = [("W8A8", cost.uniform_map(d, "int8"), "every linear int8 x int8 -> int32"),
           ("W4A4", cost.uniform_map(d, "w4a4"), "every linear int4 x int4 -> int16, K tiles <= 480, int32 sums"),
           ("W4A8", cost.uniform_map(d, "w4a8"), "every linear int4 weights x int8 activations as two int4 digits "
                                                  "(two rows per token on the int4 mode)")]
    for g in args.groups:  # group-wise weight scales: one K tile per group, its int16 block scaled on the host
        if g <= npu.INT4_MAX_KT:
            out.append((f"W4A8 g{g}", cost.uniform_map(d, f"w4a8-g{g}"), f"W4A8 with one weight scale per {g} inputs: "
                        f"K tiles of {g}, each tile's int16 block back to the host"))
    if args.alloc:
        pm = cost.read_alloc(args.alloc, d)
        cpu = sum(v == "float" for v in pm.values())
        out.append((f"mixed {os.path.basename(args.alloc)}", pm, f"--alloc {args.alloc}"
                    + (f"; {cpu} float linears on the host (their cost not modelled)" if cpu else "")))
    else:
        pm, taken = cost.mix_map(d, args.mix)
        downs = sum(t.startswith("ffn_down of") for t in taken)
        rest = [t for t in taken if not t.startswith("ffn_down of")]
        out.append((f"mixed {args.mix:g}", pm, f"stand-in rule (npu_cost.mix_map; no measured sensitivities yet): "
                    f"W8A8 for {', '.join(rest[:2])}, ffn_down of {downs} layers"
                    + (f", {', '.join(rest[2:])}" if rest[2:] else "") + ", W4A4 elsewhere"))
        pm8, _ = cost.mix_map(d, args.mix, "w4a8")
        out.append((f"mix{args.mix:g} w4a8", pm8, "the same rule with W4A8 (digits) in place of W4A4 (the choice of "
                    "bench/w4a4.py's measured allocation: same bytes)"))
    return out


def cost_table(name, d, maps, args):
    """One model's token-cost tables (module doc); returns {(map label, schedule label, GB/s): cost dict}."""
    res = {}
    for bw in args.cost_bandwidth:
        for lab, _ in cost.SCHEDULES:
            a = cost.schedule(lab, bandwidth_gbs=bw, task_us=args.task_us)
            for mlab, pm, _ in maps:
                res[(mlab, lab, bw)] = cost.token_cost(d, pm, a)
    for bw in args.cost_bandwidth:
        hdr = f"  {'schedule at ' + format(bw, 'g') + ' GB/s':<46}{'submits':>9}" + "".join(
            f"{m + ' ms':>16}{'tok/s':>7}" for m, _, _ in maps)
        print(hdr)
        print("  " + "-" * (len(hdr) - 2))
        for lab, _ in cost.SCHEDULES:
            subs = sorted({res[(m, lab, bw)]["submits"] for m, _, _ in maps})
            cells = "".join(f"{res[(m, lab, bw)]['ms']:>16.2f}{res[(m, lab, bw)]['tok_s']:>7.2f}" for m, _, _ in maps)
            print(f"  {lab:<46}{'/'.join(map(str, subs)):>9}{cells}")
        print()
    bw0, today = args.cost_bandwidth[0], cost.SCHEDULES[1][0]
    for mlab, pm, note in maps:
        r = res[(mlab, today, bw0)]
        print(f"  {mlab}: {r['bits']:.2f} NPU bits/weight, {r['bytes'] / 1e6:.1f} MB/token today (weights "
              f"{r['w_bytes'] / 1e6:.1f}, in {r['in_bytes'] / 1e6:.2f}, out {r['out_bytes'] / 1e6:.2f}, commands "
              f"{r['cmd_bytes'] / 1e6:.2f}), {r['tasks']} tasks, {r['submits']} submits; "
              f"{r['t_bytes_ms']:.2f} ms bytes + {r['t_submit_ms']:.2f} ms submits; {note}")
    return res


def goal_check(name, maps, res, args):
    """Which rows meet the goal (mixed <= 5.0 NPU bits/weight at >= 25 tok/s), and what they assume."""
    for mlab, pm, _ in maps[2:]:
        bits = res[(mlab, cost.SCHEDULES[1][0], args.cost_bandwidth[0])]["bits"]
        for bw in args.cost_bandwidth:
            ok = [(lab, res[(mlab, lab, bw)]) for lab, _ in cost.SCHEDULES if res[(mlab, lab, bw)]["tok_s"] >= GOAL_TOK_S]
            floor = res[(mlab, cost.SCHEDULES[-1][0], bw)]["t_bytes_ms"]
            head = (f"  GOAL {name} ({mlab}, {bits:.2f} <= {GOAL_BITS:g} bits: {'yes' if bits <= GOAL_BITS else 'NO'}) "
                    f"at {bw:g} GB/s, >= {GOAL_TOK_S:g} tok/s (<= {1e3 / GOAL_TOK_S:.1f} ms):")
            if not ok:
                print(f"{head} NOT met by any schedule (the bytes alone take {floor:.1f} ms)")
                continue
            lab, r = ok[0]
            need = cost.schedule(lab).on()
            print(f"{head} met from '{lab}' ({r['ms']:.1f} ms, {r['tok_s']:.1f} tok/s); it assumes "
                  f"{', '.join(need) or 'nothing beyond today'} and {bw:g} GB/s streamed")


def cost_section(args):
    """The token-cost section (module doc) for every --models entry."""
    print("ESTIMATE: the token's cost on the RK3588 NPU, decode M = 1 (no board here: planner bytes and tasks + "
          "the named assumptions of orkpy.runtime.npu_cost; ms = bytes / bandwidth + submits x (0.218 ms - hidden) "
          "+ tasks x task_us / cores)")
    for name in args.models:
        d = cost.MODELS[name]
        print(f"{name}: hidden {d['hidden']}, ffn {d['ffn']}, {d['layers']} layers, {d['n_head']} q / "
              f"{d['n_head_kv']} kv heads x {d['head_dim']}, vocab {d['vocab']}, tied head (published config)")
        maps = precision_maps(args, name, d)
        res = cost_table(name, d, maps, args)
        if name in GOAL_MODELS or args.alloc:
            goal_check(name, maps, res, args)
        print()
    best = cost.schedule(len(cost.SCHEDULES) - 1, bandwidth_gbs=args.cost_bandwidth[0], task_us=args.task_us)
    print("  assumptions (value in the best row; each schedule row switches on what its label adds):")
    for key, val, status, src in cost.describe(best):
        print(f"    {key:<16}{str(val):>7}  {status:<18}{src}")
    d0 = cost.MODELS[args.models[0]]
    t = [cost.token_cost(d0, cost.uniform_map(d0, p), cost.Assumptions())["tasks"] for p in ("int8", "w4a4")]
    print(f"  task_us is unknown (0 here unless --task-us): each us per task adds tasks / cores us per token "
          f"({args.models[0]}: {t[0]} W8A8 / {t[1]} W4A4 tasks per token -- int4's 480-code K tiles multiply them)")
    print("  not modelled: the host's own work per round trip (attention, norms, quantizing and unpacking "
          "activations) and the CPU cost of float linears; the NPU's compute at M = 1 (bytes dominate)")
    print()


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", default=DEFAULT_GGUF, help="Qwen3 GGUF to read dimensions from")
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--bandwidth", type=float, nargs="+", default=[33.8, 25.0, 20.0], help="GB/s")
    ap.add_argument("--groups", type=int, nargs="*", default=[128, 32], help="group sizes of the grouped plan")
    ap.add_argument("--models", nargs="+", default=list(cost.MODELS), choices=sorted(cost.MODELS),
                    help="models of the token-cost section (published configs)")
    mix = ap.add_mutually_exclusive_group()
    mix.add_argument("--mix", type=float, default=5.0, help="NPU bits/weight budget of the stand-in mixed map")
    mix.add_argument("--alloc", help="JSON {tensor name: w4a4 | int8 | float}: the mixed map (one model)")
    ap.add_argument("--cost-bandwidth", type=float, nargs="+", default=[33.8, 25.8], help="GB/s of the cost tables")
    ap.add_argument("--task-us", type=float, default=0.0, help="assumed cost of each task inside a chain, us")
    ap.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS)
    args = ap.parse_args(argv)
    if args.alloc and len(args.models) != 1:
        ap.error("--alloc names one model's tensors: give exactly one --models")
    return args


def main(argv=None):
    args = parse_args(argv)
    t_start = time.perf_counter()
    if set(args.sections) - {"cost"}:
        qwen3_sections(args)
    if "cost" in args.sections:
        cost_section(args)
    print(f"total runtime {time.perf_counter() - t_start:.1f} s")


def qwen3_sections(args):
    """The Qwen3-1.7B W8A8 sections (module doc): plan, roofline, grouped, timing, submits."""
    d, src = model_dims(args.gguf)
    print("Qwen3-1.7B decode (M=1) on the RK3588 NPU planner, int8 x int8 -> int32")
    print(f"dims: {src}")
    print(f"      hidden {d['hidden']}, ffn {d['ffn']}, {d['layers']} layers, {d['n_head']} q / "
          f"{d['n_head_kv']} kv heads x {d['head_dim']}, vocab {d['vocab']}, "
          f"{'tied' if d['tied'] else 'untied'} lm_head")
    print()
    hdr = (f"{'matmul':<16}{'K':>6}{'N':>8}{'tasks':>6}{'cmd qw':>8}{'weights B':>15}{'in B':>9}{'out B':>11}"
           f"{'cmd B':>9}{'bytes/call':>15}{'x':>5}{'MB/token':>10}")
    print(hdr)
    print("-" * len(hdr))
    sh = shapes(d)
    tot = dict.fromkeys(BYTES, 0)
    calls = tasks = macs = 0
    for name, K, N, cnt in sh:
        p = npu.plan(1, K, N)
        assert p["cmd_bytes"] == p["n_tasks"] * QWORDS_PER_TASK * 8, p
        per = sum(p[k] for k in BYTES)
        for k in BYTES:
            tot[k] += p[k] * cnt
        calls += cnt
        tasks += p["n_tasks"] * cnt
        macs += p["macs"] * cnt
        if "plan" in args.sections:
            print(f"{name:<16}{K:>6}{N:>8}{p['n_tasks']:>6}{p['cmd_bytes'] // 8:>8}{p['w_bytes']:>15,}"
                  f"{p['in_bytes']:>9,}{p['out_bytes']:>11,}{p['cmd_bytes']:>9,}{per:>15,}{cnt:>5}"
                  f"{per * cnt / 1e6:>10.2f}")
    total = sum(tot.values())
    print("-" * len(hdr))
    print(f"{'per token':<16}{'':>14}{tasks:>6}{tot['cmd_bytes'] // 8:>8,}{tot['w_bytes']:>15,}"
          f"{tot['in_bytes']:>9,}{tot['out_bytes']:>11,}{tot['cmd_bytes']:>9,}{total:>15,}{calls:>5}"
          f"{total / 1e6:>10.2f}")
    print(f"  {calls} matmul calls ({tasks} NPU tasks) per token; weights are {tot['w_bytes'] / total:.2%} of the "
          f"bytes; {macs / 1e9:.3f} GMAC/token")
    print()
    if "roofline" in args.sections:
        roofline(args, total, macs, calls)
    bw0 = args.bandwidth[0]
    if "grouped" in args.sections:
        grouped_plan(sh, args.groups, bw0)
    t_emit = timing(args, d, sh, total, calls) if "timing" in args.sections else 0.0
    if "submits" in args.sections:
        submit_table(d, sh, bw0, args.repeat, t_emit)


def roofline(args, total, macs, calls):
    """The bandwidth-bound estimate and RKLLM's published figures (module doc)."""
    print("ESTIMATE: bandwidth bound, no compute/submit overhead (bytes/token above / DRAM bandwidth; "
          "not measured, no board here)")
    print(f"  33.8 GB/s = RK3588 theoretical: LPDDR4x-4224 (DMC 2112 MHz) x 64 bit (docs/npu.md, "
          f"sources; an inference)")
    hdr2 = f"  {'DRAM GB/s':>10}{'ms/token':>10}{'tok/s':>8}"
    print(hdr2)
    for bw in args.bandwidth:
        s = total / (bw * 1e9)
        print(f"  {bw:>10.1f}{s * 1e3:>10.2f}{1 / s:>8.2f}")
    t_compute = macs / (NPU_MAC_PER_CYCLE * NPU_HZ)
    print(f"  compute floor for reference: {macs / 1e9:.3f} GMAC / (1024 int8 MAC/cycle x 1 GHz, one core) = "
          f"{t_compute * 1e3:.2f} ms/token")
    bw0 = args.bandwidth[0]
    s_sub = total / (bw0 * 1e9) + calls * SUBMIT_S
    print(f"  ESTIMATE with submit overhead: + {calls} submits x 0.218 ms (one tiny vendor-driver submit, "
          f"allbilly multicore.md) at {bw0:g} GB/s -> {s_sub * 1e3:.2f} ms/token, {1 / s_sub:.2f} tok/s")
    print()
    print("published RKLLM decode on RK3588 (airockchip/rknn-llm v1.3.0 benchmark.md, w8a8, seqlen 128, 64 new "
          "tokens, max freq; measured by Rockchip)")
    print("  Qwen3 1.7B itself is NOT in that table; the nearest models listed:")
    for name, tps in RKLLM:
        print(f"  {name:<24}{tps:>7.2f} tok/s")
    print("  (other models, so no ratio is taken; docs/npu.md derives >= 25.8 GB/s effective weight "
          "streaming from the Qwen2.5 1.5B figure: compare with the 25 GB/s row)")
    print()


def timing(args, d, sh, total, calls):
    """Planner + command emission of one token's matmuls, against a host copy of one layer's
    weights; returns the plan + emit time of one token (seconds)."""
    bw0 = args.bandwidth[0]

    def plan_all():
        for _, K, N, cnt in sh:
            for _ in range(cnt):
                npu.plan(1, K, N)

    def emit_all():
        for _, K, N, cnt in sh:
            for _ in range(cnt):
                npu.plan_commands(1, K, N, 0x00100000, 0x10000000, 0x20000000, 0x30000000)

    layer_w = sum(npu.plan(1, K, N)["w_bytes"] for _, K, N, cnt in sh if cnt == d["layers"])
    src_w = np.ones(layer_w, np.int8)
    dst_w = np.empty_like(src_w)
    np.copyto(dst_w, src_w)
    t_copy = best_time(lambda: np.copyto(dst_w, src_w), args.repeat)
    t_plan = best_time(plan_all, args.repeat)
    t_emit = best_time(emit_all, args.repeat)
    s_roof = total / (bw0 * 1e9)
    print(f"host planning cost per token ({calls} calls, best of {args.repeat}); baseline: numpy.copyto of one "
          f"decoder layer's int8 weights ({layer_w / 1e6:.1f} MB) on this host, {layer_w / t_copy / 1e9:.2f} GB/s")
    hdr3 = f"  {'what':<36}{'ms/token':>10}{'x baseline':>12}{'x est. token':>14}"
    print(hdr3)
    print("  " + "-" * (len(hdr3) - 2))
    print(f"  {'baseline: copy one layer weights':<36}{t_copy * 1e3:>10.3f}{1.0:>12.3f}{t_copy / s_roof:>14.4f}")
    print(f"  {'plan() (Python dicts)':<36}{t_plan * 1e3:>10.3f}{t_plan / t_copy:>12.3f}{t_plan / s_roof:>14.4f}")
    print(f"  {'plan_commands() (plan + emit)':<36}{t_emit * 1e3:>10.3f}{t_emit / t_copy:>12.3f}"
          f"{t_emit / s_roof:>14.4f}")
    print(f"  ('x est. token' = fraction of the {bw0:g} GB/s bandwidth-bound token time, {s_roof * 1e3:.2f} ms; "
          f"host here is {os.uname().machine}, not the RK3588's A76)")
    print()
    return t_emit


if __name__ == "__main__":
    main()
