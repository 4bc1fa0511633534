"""orkpy's command line: ``orkpy COMMAND ...`` or ``python -m orkpy COMMAND``."""
import argparse
import json
import os
import sys

from . import __version__
from ._core import NPUError


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
    from .npu import BACKENDS, unavailable
    why = unavailable()
    for b in BACKENDS:
        print(f"npu {b + ':':<12} {'available' if b not in why else 'unavailable - ' + why[b]}")
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


def read_text_like_llama_cpp(path):
    """A text file as llama-perplexity -f reads it: UTF-8, one trailing newline dropped."""
    with open(path, "r", encoding="utf-8", newline="") as f:
        text = f.read()
    return text[:-1] if text.endswith("\n") else text


def _weights_arg(spec):
    """--weights: a path name, an emit-map file, or a GGUF whose types allocate the tiers."""
    import os

    from .model import PATHS
    from .tiermap import TierMap, tier_map
    if spec in PATHS:
        return spec
    if not os.path.exists(spec):
        raise ValueError(f"--weights {spec!r} is neither a path name ({', '.join(PATHS)}) nor a file")
    if spec.endswith(".gguf"):
        return tier_map(spec)
    return TierMap.load(spec)


def _cmd_ppl(args):
    from .model import load_model
    from .ppl import perplexity

    model = load_model(args.model, weights=_weights_arg(args.weights), int4_kind=args.int4_kind,
                       threads=args.threads)
    text = read_text_like_llama_cpp(args.text)
    if args.npu:
        from . import npu
        routed = npu.use_npu(model, npu.Device(args.npu))
        print(f"npu: {routed} packed linear layer(s) run their int8 matmuls on the '{args.npu}' backend",
              file=sys.stderr)
    r = perplexity(model, text, n_ctx=args.ctx, chunks=args.chunks, threads=args.threads,
                   progress=not args.no_progress, save_logprobs=args.save_logprobs, kld_base=args.kld_base)
    if args.json:
        print(r.to_json(indent=2))
    else:
        print(f"{model}")
        print(f"tokens {r.n_tokens}, {r.chunks} chunks of {r.n_ctx}, {r.scored} scored")
        print(f"Final estimate: {r}")
    return 0


def _cmd_imatrix(args):
    from .calibrate import collect_imatrix
    from .model import load_model

    model = load_model(args.model, threads=args.threads)
    im = collect_imatrix(model, read_text_like_llama_cpp(args.text), n_ctx=args.ctx, chunks=args.chunks,
                         threads=args.threads, progress=not args.no_progress)
    im.datasets = [os.path.basename(args.text)]
    im.save(args.output, format="dat" if args.output.endswith(".dat") else "gguf")
    print(f"imatrix of {len(im.names())} tensors over {im.chunks} chunks of {args.ctx} -> {args.output}")
    return 0


def _cmd_quantize(args):
    from .calibrate import quantize_model

    qm = quantize_model(args.source, args.alloc, imatrix=args.imatrix, kind=args.kind, sr=args.sr, seed=args.seed,
                        threshold=args.threshold, threads=args.threads, progress=not args.no_progress)
    out = qm.save(args.output, overwrite=args.overwrite)
    b = qm.result_bytes()
    print(f"{qm}\nwrote {out} (int8 {b['int8']:,} bytes, int4 {b['int4']:,} bytes; "
          f"int8 share of weight storage {qm.int8_share():.1%})")
    return 0


def _cmd_ffn_sweep(args):
    from .ffn import sweep

    rows, stats = sweep(args.model, read_text_like_llama_cpp(args.text), read_text_like_llama_cpp(args.calib),
                        n_ctx=args.ctx, chunks=args.chunks, calib_chunks=args.calib_chunks, threads=args.threads,
                        log=lambda m: print(m, file=sys.stderr))
    print("gmax per layer: " + ", ".join(f"{i}: {s['gmax']:.3f}" for i, s in enumerate(stats)))
    print(f"{'mode':<18}{'exact layers':<22}{'PPL':>9}{'+/-':>9}{'KL':>11}{'s':>7}")
    for r in rows:
        print(f"{r['mode']:<18}{str(r['exact_layers']):<22}{r['ppl']:>9.4f}{r['ppl_err']:>9.4f}{r['kl']:>11.6f}"
              f"{r['wall_s']:>7.1f}")
    if args.json:
        from ._io import atomic_write
        atomic_write(args.json, [("\n".join(json.dumps(r) for r in rows) + "\n").encode()])
    return 0


def _cmd_npu_dump(args):
    from .npu import dump, read_commands

    print(dump(read_commands(args.file)))
    return 0


def _cmd_npu_plan(args):
    from .npu import dump, plan, plan_commands

    caps = dict(max_m=args.max_m, max_k=args.max_k, max_n=args.max_n)
    p = plan(args.M, args.K, args.N, **caps)
    if args.json:
        print(json.dumps(p, indent=1))
        return 0
    print(f"int8 matmul ({args.M} x {args.K}) x ({args.K} x {args.N}) -> int32: {p['n_tasks']} task(s) "
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


def _cmd_gate(args):
    from .gate import format_gate, run_gate

    synthetic = args.model is None
    if synthetic:
        if args.alloc or args.text:
            raise ValueError("give MODEL ALLOC TEXT together, or none of them for the synthetic model")
        import tempfile

        from .synthetic import make_synthetic
        paths = make_synthetic(tempfile.mkdtemp(prefix="orkpy-synthetic-"))
        print("no model given: generated a seeded synthetic Llama-layout model (random weights; its PPL means "
              f"nothing, it proves the pipeline) in {os.path.dirname(paths['model'])}")
        args.model, args.alloc, args.text = paths["model"], paths["alloc"], paths["text"]
    elif not (args.alloc and args.text):
        raise ValueError("usage: orkpy gate MODEL_F16 ALLOC_GGUF|MAP TEXT [--calib TEXT]")
    rows, out_dir = run_gate(args.model, args.alloc, args.text, calib_path=args.calib, n_ctx=args.ctx,
                             chunks=args.chunks, calib_chunks=args.calib_chunks, kind=args.kind, out_dir=args.out,
                             threads=args.threads, progress=not args.no_progress)
    print(format_gate(rows, synthetic=synthetic))
    print(f"models and reference log-probs in {out_dir}")
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
    s = sub.add_parser("ppl", help="perplexity with llama-perplexity's method (and KL-divergence mode)")
    s.add_argument("model", help="GGUF model (llama or qwen3)")
    s.add_argument("text", help="UTF-8 text file (one trailing newline is dropped, as llama-perplexity -f)")
    s.add_argument("--ctx", type=_positive_int, default=512)
    s.add_argument("--chunks", type=_positive_int, default=None)
    s.add_argument("--weights", default="gguf",
                   help="fp32|gguf|int8|nf4|int4, an emit-map file, or a mixed GGUF used as allocation oracle")
    s.add_argument("--int4-kind", choices=["nf4", "int4"], default="nf4")
    s.add_argument("--threads", type=_positive_int, default=None)
    s.add_argument("--npu", choices=["emu", "rknpu", "rocket"],
                   help="run the packed linears' int8 matmuls on an NPU backend (same results as the CPU path)")
    s.add_argument("--save-logprobs", metavar="FILE", help="store reference log-probs for a later --kld-base")
    s.add_argument("--kld-base", metavar="FILE", help="report KL divergence against stored reference log-probs")
    s.add_argument("--no-progress", action="store_true")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_cmd_ppl)

    s = sub.add_parser("imatrix", help="collect an importance matrix in the forward pass")
    s.add_argument("model")
    s.add_argument("text")
    s.add_argument("-o", "--output", required=True, help="FILE.gguf (llama.cpp's GGUF imatrix) or FILE.dat (legacy)")
    s.add_argument("--ctx", type=_positive_int, default=512)
    s.add_argument("--chunks", type=_positive_int, default=None)
    s.add_argument("--threads", type=_positive_int, default=None)
    s.add_argument("--no-progress", action="store_true")
    s.set_defaults(func=_cmd_imatrix)

    s = sub.add_parser("quantize", help="quantize a model: fp16 source + allocation (+ imatrix) -> model directory")
    s.add_argument("source", help="F32/F16/BF16 GGUF (a quantized GGUF here means double-quant, said loudly)")
    s.add_argument("--alloc", required=True, help="a llama.cpp mixed GGUF (types only) or an emit-map file")
    s.add_argument("--imatrix", help="imatrix file (.dat or GGUF, llama.cpp's or orkpy's)")
    s.add_argument("--kind", choices=["nf4", "int4"], default="nf4")
    s.add_argument("--sr", action="store_true", help="stochastic rounding")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--threshold", type=float, default=5.0)
    s.add_argument("--threads", type=_positive_int, default=None)
    s.add_argument("-o", "--output", required=True, help="output model directory")
    s.add_argument("--overwrite", action="store_true")
    s.add_argument("--no-progress", action="store_true")
    s.set_defaults(func=_cmd_quantize)

    s = sub.add_parser("ffn-sweep", help="the fused int8 SwiGLU chain: every mode, ablation and sprinkle, PPL + KL")
    s.add_argument("model")
    s.add_argument("text")
    s.add_argument("--calib", required=True, help="calibration text for the prep pass")
    s.add_argument("--ctx", type=_positive_int, default=256)
    s.add_argument("--chunks", type=_positive_int, default=None)
    s.add_argument("--calib-chunks", type=_positive_int, default=None)
    s.add_argument("--threads", type=_positive_int, default=None)
    s.add_argument("--json", help="write one JSON row per configuration (JSON lines)")
    s.set_defaults(func=_cmd_ffn_sweep)

    s = sub.add_parser("npu-dump", help="decode an RK3588 NPU register command buffer into a listing")
    s.add_argument("file", help="little-endian binary qwords, or text with one hex qword per line")
    s.set_defaults(func=_cmd_npu_dump)

    s = sub.add_parser("npu-plan", help="how an int8 matmul is split into NPU tasks (and its command stream)")
    s.add_argument("M", type=_positive_int)
    s.add_argument("K", type=_positive_int)
    s.add_argument("N", type=_positive_int)
    for cap in ("max_m", "max_k", "max_n"):
        s.add_argument("--" + cap.replace("_", "-"), dest=cap, type=int, default=0, help="lower per-task cap (tests)")
    s.add_argument("--limit", type=_positive_int, default=20, help="tasks listed (default 20)")
    s.add_argument("--dump", action="store_true", help="also print the chained command listing")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_cmd_npu_plan)

    s = sub.add_parser("gate", help="end to end: tier map -> imatrix -> quantize -> save -> reload -> PPL/KL")
    s.add_argument("model", nargs="?", help="the fp16 (or f32/bf16) source GGUF; omit all three for a synthetic model")
    s.add_argument("alloc", nargs="?", help="a llama.cpp mixed GGUF (allocation oracle) or an emit-map file")
    s.add_argument("text", nargs="?", help="evaluation text")
    s.add_argument("--calib", help="calibration text for the imatrix (default: the evaluation text)")
    s.add_argument("--ctx", type=_positive_int, default=256)
    s.add_argument("--chunks", type=_positive_int, default=None)
    s.add_argument("--calib-chunks", type=_positive_int, default=None)
    s.add_argument("--kind", choices=["nf4", "int4"], default="nf4")
    s.add_argument("--out", help="folder for the quantized models (default: a temporary folder)")
    s.add_argument("--threads", type=_positive_int, default=None)
    s.add_argument("--no-progress", action="store_true")
    s.set_defaults(func=_cmd_gate)

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
    except NPUError as e:  # no device, a driver call failed, a timeout
        print(f"orkpy {args.command}: {type(e).__name__}: {e}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
