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
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError, OSError) as e:
        print(f"orkpy {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
