"""The inspection commands: info, quant-report, gguf-info, tier-map, npu-dump, npu-plan."""
import argparse
import collections
import json

from .. import __version__
from ._common import _check_output_path, _positive_int, _threshold

def _cmd_info(args):
    from ..kernels.cpu import capabilities
    from ..runtime.npu import BACKENDS, unavailable

    caps = capabilities()
    why = unavailable()
    if args.json:
        caps = dict(caps, npu={b: {"available": b not in why, "reason": why.get(b)} for b in BACKENDS})
        print(json.dumps(caps, indent=2, sort_keys=True))
        return 0
    feats = ", ".join(k for k, v in caps["cpu_features"].items() if v) or "none"
    print(f"orkpy {__version__}")
    print(f"arch:            {caps['arch']}")
    print(f"cpu features:    {feats}")
    print(f"kernels in use:  {caps['isa']} (quant: {caps['quant_kernels']}, matmul: {caps['matmul_kernels']})")
    print(f"available ISAs:  {', '.join(caps['available'])}")
    print(f"forced scalar:   {caps['forced_scalar']} (set {caps['force_scalar_env']}=1 to force)")
    print(f"default threads: {caps['default_threads']}")
    for b in BACKENDS:
        print(f"npu {b + ':':<12} {'available' if b not in why else 'unavailable - ' + why[b]}")
    return 0


def _cmd_quant_report(args):
    from ..evaluation.report import format_quant_report, quant_report

    rows_out, ratios = quant_report(args.rows, args.cols, args.seed, args.threads)
    if args.json:
        print(json.dumps({"shape": [args.rows, args.cols], "seed": args.seed,
                          "errors": [dict(weight=w, kind=k, rms=r, rel_rms=rr) for w, k, r, rr in rows_out],
                          "nf4_over_int4": ratios}, indent=2))
    else:
        print(format_quant_report(rows_out, ratios, (args.rows, args.cols), args.seed))
    return 0


def _summarise(v, limit=8):
    """Long arrays shortened for display."""
    import numpy as np
    if isinstance(v, np.ndarray):
        if v.size <= limit:
            return f"[{', '.join(str(x) for x in v.tolist())}]"
        return f"array[{v.size}] of {v.dtype}: [{', '.join(str(x) for x in v[:4].tolist())}, ...]"
    if isinstance(v, list):
        if len(v) <= limit:
            return "[" + ", ".join(_summarise(x) for x in v) + "]"
        return f"list[{len(v)}]: [{', '.join(_summarise(x) for x in v[:4])}, ...]"
    if isinstance(v, str):
        s = v if len(v) <= 80 else v[:77] + "..."
        return repr(s)
    return str(v)


def _cmd_gguf_info(args):
    from ..formats.gguf import GGUFFile

    with GGUFFile(args.file) as g:
        print(f"file:        {g.path}")
        print(f"version:     {g.version}")
        print(f"alignment:   {g.alignment}")
        print(f"data offset: {g.data_offset}")
        print(f"metadata:    {len(g.metadata)} keys")
        for k, v in g.metadata.items():
            print(f"  {k:<44} {g.metadata_types[k]:<8} {_summarise(v)}")
        print(f"tensors:     {len(g.tensors)}")
        print(f"  {'name':<34}{'type':<9}{'shape':<18}{'bpw':>7}{'bytes':>12}{'offset':>12}")
        for t in g.tensors:
            shape = "x".join(str(d) for d in t.shape)
            print(f"  {t.name:<34}{t.type:<9}{shape:<18}{t.bits_per_weight:>7.3f}{t.nbytes:>12}{t.offset:>12}")
    return 0


def _cmd_tier_map(args):
    from ..formats.tiermap import INT_TIERS, tier_map

    if args.emit_map:
        _check_output_path(args.emit_map, "--emit-map")
    tm = tier_map(args.file, threshold=args.threshold, embeddings=args.embeddings, output=args.output_tier,
                  fallback="literal" if args.literal_types else "infer")
    by_tt = tm.counts_by_type_and_tier()
    print(f"tier map of {args.file} (threshold {tm.threshold:g} bits/weight; tied head: {tm.tied})")
    print(f"{'ggml type':<10}{'tier':<7}{'tensors':>8}")
    for (gt, tier), n in sorted(by_tt.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"{gt:<10}{tier:<7}{n:>8}")
    c = tm.counts_by_tier()
    b = tm.result_bytes()
    mid = [t for t in INT_TIERS if t not in ("int8", "int4")]  # int6, int5: only when the map has them
    mid_c = "".join(f", {t} {c[t]}" for t in mid if c.get(t))
    mid_b = "".join(f", {t} {b[t]:,}" for t in mid if b.get(t))
    print(f"tiers: int8 {c['int8']}{mid_c}, int4 {c['int4']}, float {c['float']}")
    print(f"packed linear weight bytes: int8 {b['int8']:,}{mid_b}, int4 {b['int4']:,}")
    print(f"int8 share of weight storage: {tm.int8_share():.1%}")
    fb = tm.fallbacks()
    if fb:
        pairs = collections.Counter((e.ggml_type, e.intended) for e in fb.values())
        rows = sorted({e.shape[-1] for e in fb.values()})
        print(f"{len(fb)} tensors read through a llama.cpp fallback type (rows of {', '.join(map(str, rows))}): "
              + ", ".join(f"{n} {s} (intended {i})" for (s, i), n in sorted(pairs.items()))
              + ("; tiered by the stored types (--literal-types)" if args.literal_types
                 else "; tiered by the intended types"))
    if args.emit_map:
        tm.save(args.emit_map)
        print(f"wrote {args.emit_map}")
    return 0


def _cmd_npu_dump(args):
    from ..runtime.npu import dump, read_commands

    print(dump(read_commands(args.file)))
    return 0


def _cmd_npu_plan(args):
    from ..runtime.npu import dump, plan, plan_commands

    caps = dict(max_m=args.max_m, max_k=args.max_k, max_n=args.max_n, precision=args.precision)
    p = plan(args.M, args.K, args.N, **caps)
    if args.json:
        print(json.dumps(p, indent=1))
        return 0
    what = ("int4 matmul ({M} x {K}) x ({K} x {N}) -> int16 K tiles of <= 480, summed in int32"
            if args.precision == "int4" else "int8 matmul ({M} x {K}) x ({K} x {N}) -> int32")
    print(f"{what.format(M=args.M, K=args.K, N=args.N)}: {p['n_tasks']} task(s) "
          f"(m {p['nm']} x k {p['nk']} x n {p['nn']}), {p['cmd_bytes'] // 8} command qwords")
    print(f"buffers: input {p['in_bytes']} B, weights {p['w_bytes']} B, output {p['out_bytes']} B, "
          f"commands {p['cmd_bytes']} B; {p['macs']} MACs on the NPU")
    print(f"{'task':>5} {'m0':>6} {'Mt':>5} {'Mp':>5} {'k0':>6} {'Kt':>5} {'n0':>6} {'Nt':>5}")
    for i, t in enumerate(p["tasks"][:args.limit]):
        print(f"{i:5d} {t['m0']:6d} {t['Mt']:5d} {t['Mp']:5d} {t['k0']:6d} {t['Kt']:5d} {t['n0']:6d} {t['Nt']:5d}")
    if len(p["tasks"]) > args.limit:
        print(f"  ... {len(p['tasks']) - args.limit} more")
    if args.dump:
        print(dump(plan_commands(args.M, args.K, args.N, 0x100000, 0x1000000, 0x10000000, 0x40000000, **caps)))
    return 0


def add_info(sub):
    s = sub.add_parser("info", help="CPU features, the kernels in use and the NPU backends")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=_cmd_info)


def add_quant_report(sub):
    s = sub.add_parser("quant-report", help="reconstruction error of every kind on seeded weights")
    s.add_argument("--rows", type=_positive_int, default=1024, help="rows (N) of the test weights")
    s.add_argument("--cols", type=_positive_int, default=4096, help="columns (K) of the test weights")
    s.add_argument("--seed", type=int, default=0, help="seed of the test weights")
    s.add_argument("-t", "--threads", type=_positive_int, default=None,
                   help="worker threads; never changes a result (default: all cores)")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=_cmd_quant_report)


def add_npu_dump(sub):
    s = sub.add_parser("npu-dump", help="decode an RK3588 NPU register command buffer into a listing")
    s.add_argument("file", help="little-endian binary qwords, or text with one hex qword per line")
    s.set_defaults(func=_cmd_npu_dump)


def add_npu_plan(sub):
    s = sub.add_parser("npu-plan", help="how an int8 (or int4) matmul is split into NPU tasks (and its command stream)")
    s.add_argument("M", type=_positive_int, help="rows of the activations")
    s.add_argument("K", type=_positive_int, help="inputs (the contracted dimension)")
    s.add_argument("N", type=_positive_int, help="outputs")
    for cap in ("max_m", "max_k", "max_n"):
        s.add_argument("--" + cap.replace("_", "-"), dest=cap, type=int, default=0,
                       help="lower per-task cap, to force chains in tests (default: 0, the hardware limit)")
    s.add_argument("--precision", choices=("int8", "int4"), default="int8",
                   help="int8 x int8 -> int32 (default) or int4 x int4 -> int16 tiles (W4A4; docs/npu.md)")
    s.add_argument("--limit", type=_positive_int, default=20, help="tasks listed")
    s.add_argument("--dump", action="store_true", help="also print the chained command listing")
    s.add_argument("--json", action="store_true", help="print the plan as JSON")
    s.set_defaults(func=_cmd_npu_plan)


def add_gguf_info(sub):
    s = sub.add_parser("gguf-info", help="header, metadata and tensor table of a GGUF file")
    s.add_argument("file", help="a GGUF file")
    s.set_defaults(func=_cmd_gguf_info)


def add_tier_map(sub):
    from ..formats.tiermap import OVERRIDES

    s = sub.add_parser("tier-map", help="int8/int4 tier per tensor from a mixed GGUF's types")
    s.add_argument("--literal-types", action="store_true",
                   help="tier tensors that llama-quantize stored on a fallback type (rows not a multiple of 256) by "
                        "the stored type, not the type llama.cpp intended (default: intended)")
    tiers = list(OVERRIDES)
    s.add_argument("file", help="a (mixed) GGUF: its tensor types decide the tiers")
    s.add_argument("--threshold", type=_threshold, default=5.0, help="bits/weight at or above which a type is int8")
    s.add_argument("--embeddings", choices=tiers, default="by_type", help="tier of the embedding table")
    s.add_argument("--output-tier", "--head", dest="output_tier", choices=tiers, default="by_type",
                   help="tier of the LM head (output.weight)")
    s.add_argument("--output", dest="output_tier", choices=tiers, help=argparse.SUPPRESS)  # the old spelling
    s.add_argument("--emit-map", metavar="OUT", default=None,
                   help="write the tier map, emit-map text format (default: not written)")
    s.set_defaults(func=_cmd_tier_map)
