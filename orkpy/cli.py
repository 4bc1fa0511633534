"""orkpy's command line: ``orkpy COMMAND ...`` or ``python -m orkpy COMMAND``."""
import argparse
import json
import sys

from . import __version__


def _cmd_info(args):
    from .cpu import capabilities

    caps = capabilities()
    if args.json:
        print(json.dumps(caps, indent=2, sort_keys=True))
        return 0
    feats = ", ".join(k for k, v in caps["cpu_features"].items() if v) or "none"
    print(f"orkpy {__version__}")
    print(f"arch:            {caps['arch']}")
    print(f"cpu features:    {feats}")
    print(f"kernels in use:  {caps['isa']} (quant: {caps['quant_kernels']})")
    print(f"available ISAs:  {', '.join(caps['available'])}")
    print(f"forced scalar:   {caps['forced_scalar']} (set {caps['force_scalar_env']}=1 to force)")
    print(f"default threads: {caps['default_threads']}")
    return 0


def _cmd_quant_report(args):
    from .report import format_quant_report, quant_report

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
    from .gguf import GGUFFile

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
    from .tiermap import tier_map

    tm = tier_map(args.file, threshold=args.threshold, embeddings=args.embeddings, output=args.output)
    by_tt = tm.counts_by_type_and_tier()
    print(f"tier map of {args.file} (threshold {tm.threshold:g} bits/weight; tied head: {tm.tied})")
    print(f"{'ggml type':<10}{'tier':<7}{'tensors':>8}")
    for (gt, tier), n in sorted(by_tt.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"{gt:<10}{tier:<7}{n:>8}")
    c = tm.counts_by_tier()
    b = tm.result_bytes()
    print(f"tiers: int8 {c['int8']}, int4 {c['int4']}, float {c['float']}")
    print(f"quantized result bytes: int8 {b['int8']:,}, int4 {b['int4']:,}")
    print(f"int8 share of the weights (by bytes of the int8/int4 result): {tm.int8_share():.2%}")
    if args.emit_map:
        tm.save(args.emit_map)
        print(f"wrote {args.emit_map}")
    return 0


def _positive_int(s):
    v = int(s)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {s}")
    return v


def build_parser():
    p = argparse.ArgumentParser(prog="orkpy", description=__doc__)
    p.add_argument("--version", action="version", version=f"orkpy {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    s = sub.add_parser("info", help="CPU features and the kernels in use")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=_cmd_info)

    s = sub.add_parser("quant-report", help="reconstruction error of every kind on seeded weights")
    s.add_argument("--rows", type=_positive_int, default=1024)
    s.add_argument("--cols", type=_positive_int, default=4096)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--threads", type=_positive_int, default=None)
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=_cmd_quant_report)
    s = sub.add_parser("gguf-info", help="header, metadata and tensor table of a GGUF file")
    s.add_argument("file")
    s.set_defaults(func=_cmd_gguf_info)

    s = sub.add_parser("tier-map", help="int8/int4 tier per tensor from a mixed GGUF's types")
    s.add_argument("file")
    s.add_argument("--threshold", type=float, default=5.0, help="bits/weight at or above which a type is int8")
    s.add_argument("--embeddings", choices=["by_type", "int8", "int4", "float"], default="by_type")
    s.add_argument("--output", choices=["by_type", "int8", "int4", "float"], default="by_type")
    s.add_argument("--emit-map", metavar="OUT", help="write the tier map (emit-map text format)")
    s.set_defaults(func=_cmd_tier_map)
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError, OSError, KeyError) as e:
        print(f"orkpy {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
