"""The evaluation commands: ppl, gate, ffn-sweep."""
import argparse
import json
import os
import sys

from ._common import (_META_HELP, _MODEL_HELP, _PACKED_WEIGHTS, _TEXT_HELP, UsageError, _add_act_args,
                      _add_common_args, _add_transform_args, _check_output_path, _meta_arg, _positive_int,
                      _transform_kwargs, _warn_ctx, _weights_arg, read_text_like_llama_cpp, weights_help)

def _kl_files(args):
    """(save_logprobs, kld_base) from --save-logprobs / --kld-base or llama-perplexity's spelling:
    --kl-divergence-base F alone writes the reference, with --kl-divergence it is read."""
    save, base = args.save_logprobs, args.kld_base
    if args.kl_divergence_base is not None:
        if save is not None or base is not None:
            raise UsageError("--kl-divergence-base names the reference file: do not also give --save-logprobs "
                             "or --kld-base")
        if args.kl_divergence:
            base = args.kl_divergence_base
        else:
            save = args.kl_divergence_base
    elif args.kl_divergence and base is None:
        raise UsageError("--kl-divergence needs the reference: --kl-divergence-base FILE (written by an earlier "
                         "run with --kl-divergence-base FILE alone)")
    return save, base


def _cmd_ppl(args):
    from ..kernels.actspec import ACT_MODE_INFO
    from ..runtime.model import load_model
    from ..evaluation.ppl import perplexity

    save, base = _kl_files(args)
    if args.npu and args.weights in ("gguf", "fp32"):
        raise UsageError(f"--npu {args.npu} runs packed linear layers, and --weights {args.weights} has none: "
                         f"use --weights {_PACKED_WEIGHTS}")
    if save is not None:
        _check_output_path(save, "--save-logprobs" if args.kl_divergence_base is None else "--kl-divergence-base")
    if base is not None and not os.path.isfile(base):
        raise FileNotFoundError(f"{base}: no such reference log-prob file")
    meta = _meta_arg(args, args.model)
    weights = _weights_arg(args.weights)
    text = read_text_like_llama_cpp(args.text)
    calib = read_text_like_llama_cpp(args.calib) if args.calib else None
    if args.act is not None and ACT_MODE_INFO[args.act].calibrated and calib is None and args.act_calib is None \
            and not os.path.isdir(args.model):
        raise UsageError(f"--act {args.act} needs calibrated activations: --calib TEXT (a text that is not scored) "
                         "or --act-calib act_scales.json")
    model = load_model(args.model, weights=weights, int4_kind=args.int4_kind, threads=args.threads, meta=meta,
                       act=args.act, act_calib=args.act_calib, calib_ctx=args.ctx, calib_chunks=args.calib_chunks,
                       **_transform_kwargs(args, calib))
    _warn_ctx(model.hparams.get("n_ctx_train"), args.ctx, args.command)
    if args.npu:
        from ..runtime import npu
        routed = npu.use_npu(model, npu.Device(args.npu))
        if not routed:
            raise UsageError(f"--npu {args.npu}: --weights {args.weights} leaves no packed linear layer to run on "
                             f"the NPU (use --weights {_PACKED_WEIGHTS})")
        print(f"npu: {routed} packed linear layer(s) run their int8 matmuls on the '{args.npu}' backend",
              file=sys.stderr)
    r = perplexity(model, text, n_ctx=args.ctx, chunks=args.chunks, threads=args.threads,
                   progress=not args.no_progress, save_logprobs=save, kld_base=base)
    if args.json:
        print(r.to_json(indent=2))
    else:
        print(f"{model}")
        print(f"tokens {r.n_tokens}, {r.chunks} chunks of {r.n_ctx}, {r.scored} scored")
        print(f"Final estimate: {r}")
    return 0


def _cmd_ffn_sweep(args):
    from ..evaluation.ffn import sweep
    from ..formats.gguf import GGUFFile
    from ..formats.source import hparams

    if args.json_out:
        _check_output_path(args.json_out, "--json-out")
    meta = _meta_arg(args, args.model)
    text, calib = read_text_like_llama_cpp(args.text), read_text_like_llama_cpp(args.calib)
    with GGUFFile(meta if meta is not None else args.model) as g:
        _warn_ctx(hparams(g).get("n_ctx_train"), args.ctx, args.command)
    rows, stats = sweep(args.model, text, calib, n_ctx=args.ctx, chunks=args.chunks, calib_chunks=args.calib_chunks,
                        threads=args.threads, progress=not args.no_progress, log=lambda m: print(m, file=sys.stderr),
                        meta=meta, sens_chunks=args.sens_chunks, sens_budget=args.sens_budget,
                        sens_method=args.sens_method, act=args.act, act_calib=args.act_calib, rotate=args.rotate,
                        rotate_online=args.rotate_online, smooth=args.smooth)
    if args.json:
        for r in rows:
            print(json.dumps(r))
    if args.json_out:
        from .._io import atomic_write
        atomic_write(args.json_out, [("\n".join(json.dumps(r) for r in rows) + "\n").encode()])
    if args.json:
        return 0
    print("gmax per layer: " + ", ".join(f"{i}: {s['gmax']:.3f}" for i, s in enumerate(stats)))
    print(f"{'mode':<30}{'exact layers':<22}{'PPL':>9}{'+/-':>9}{'KL':>11}{'s':>7}")
    for r in rows:
        print(f"{r['mode']:<30}{str(r['exact_layers']):<22}{r['ppl']:>9.4f}{r['ppl_err']:>9.4f}{r['kl']:>11.6f}"
              f"{r['wall_s']:>7.1f}")
    for r in rows:
        if "calib_s" in r:
            print(f"{r['mode']}: {r['method']} search, budget {r['budget']}, on {r['calib_chunks']} calibration "
                  f"chunks: {r['calib_s']:.1f} s, calibration KL {r['calib_kl']:.6f}; KL gain of each layer alone: "
                  + ", ".join(f"{i}: {g:.5f}" for i, g in enumerate(r["gain"])))
    return 0


def _gate_limit(s):
    v = float(s)
    if not v >= 0.0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {s}")
    return v


def _cmd_gate(args):
    import tempfile

    from ..evaluation.gate import format_gate, run_gate, verdict

    given = [a for a in (args.model, args.alloc, args.text) if a is not None]
    synthetic = not given
    if given and len(given) < 3:
        raise UsageError("usage: orkpy gate MODEL_F16 ALLOC_GGUF|MAP TEXT [--calib TEXT], or no files for the "
                         "synthetic model")
    if args.out is not None:
        _check_output_path(args.out, "--out", is_dir=True)
    if synthetic and args.meta is not None:
        raise UsageError("--meta is for a safetensors MODEL; the synthetic model (no files given) is a GGUF")
    meta = _meta_arg(args, args.model, fallback=args.alloc if args.alloc and args.alloc.endswith(".gguf") else None)
    with tempfile.TemporaryDirectory(prefix="orkpy-synthetic-") as tmp:
        if synthetic:
            from ..evaluation.synthetic import make_synthetic
            where = os.path.join(args.out, "synthetic") if args.out is not None else tmp
            paths = make_synthetic(where)
            print("no model given: generated a seeded synthetic Llama-layout model (random weights; its PPL means "
                  "nothing, it proves the pipeline) " + (f"in {where}" if args.out is not None else
                                                        "in a temporary folder"))
            args.model, args.alloc, args.text = paths["model"], paths["alloc"], paths["text"]
            if args.calib is None:
                args.calib = paths["calib"]
        rows, out_dir = run_gate(args.model, args.alloc, args.text, calib_path=args.calib, n_ctx=args.ctx,
                                 chunks=args.chunks, calib_chunks=args.calib_chunks, kind=args.kind,
                                 out_dir=args.out, threads=args.threads, progress=not args.no_progress, meta=meta)
    print(format_gate(rows, synthetic=synthetic))
    if out_dir is not None:
        extra = ", synthetic/ (the generated model and texts)" if synthetic else ""
        print(f"kept in {out_dir}: model-imatrix/ and model-plain/ (the quantized models), source-logprobs.npz "
              f"(the source's reference log-probs){extra}")
    else:
        print("temporary files removed (--out DIR keeps the quantized models and the reference log-probs)")
    passed, line = verdict(rows, max_dppl=args.max_dppl, max_dppl_rel=args.max_dppl_rel, max_kld=args.max_kld)
    print(line)
    return 1 if passed is False else 0


def _sens_budget(s):
    """ffn-sweep --sens-budget: an int (exact layers) or, written with a point or exponent, a KL target."""
    if any(c in s for c in ".eE"):
        v = float(s)
        if not v >= 0.0 or v == float("inf"):
            raise argparse.ArgumentTypeError(f"KL target must be a finite number >= 0, got {s}")
        return v
    v = int(s)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be a number of layers >= 0 or a KL target, got {s}")
    return v


def add_ppl(sub):
    from ..runtime.npu import BACKENDS
    from ..kernels.quant import FOUR_BIT_KINDS

    s = sub.add_parser("ppl", help="perplexity with llama-perplexity's method (and KL-divergence mode)")
    s.add_argument("model", nargs="?", metavar="MODEL", help=_MODEL_HELP)
    s.add_argument("text", nargs="?", metavar="TEXT", help=_TEXT_HELP)
    _add_common_args(s, ctx=512)
    s.add_argument("--meta", metavar="GGUF", default=None, help=_META_HELP + " (default: none)")
    s.add_argument("--weights", default="gguf",
                   help=weights_help())
    s.add_argument("--int4-kind", choices=FOUR_BIT_KINDS, default="nf4",
                   help="codebook of the int4-tier linears when --weights is a map or an allocation")
    s.add_argument("--npu", choices=BACKENDS, default=None,
                   help="run the packed linears' int8 matmuls on an NPU backend, same results as the CPU path; "
                        f"needs --weights {_PACKED_WEIGHTS} (default: the CPU)")
    _add_act_args(s)
    _add_transform_args(s)
    s.add_argument("--save-logprobs", metavar="FILE", default=None,
                   help="store the reference log-probs for a later --kld-base (default: not stored)")
    s.add_argument("--kld-base", metavar="FILE", default=None,
                   help="report KL divergence against a --save-logprobs file (default: no KL)")
    s.add_argument("--kl-divergence-base", metavar="FILE", default=None,
                   help="llama-perplexity's spelling: alone, write the reference log-probs to FILE; with "
                        "--kl-divergence, read them and report KL divergence (default: none)")
    s.add_argument("--kl-divergence", action="store_true",
                   help="report KL divergence against --kl-divergence-base FILE")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    s.add_argument("--json", action="store_true", help="print the result as JSON")
    s.set_defaults(func=_cmd_ppl)


def add_ffn_sweep(sub):
    s = sub.add_parser("ffn-sweep", help="the fused int8 SwiGLU chain: every mode, ablation and sprinkle, PPL + KL")
    s.add_argument("model", nargs="?", metavar="MODEL",
                   help="GGUF model or a safetensors checkpoint (with --meta); or -m/--model")
    s.add_argument("text", nargs="?", metavar="TEXT", help=_TEXT_HELP)
    s.add_argument("--calib", required=True, metavar="TEXT", help="calibration text for the prep pass (required)")
    s.add_argument("--meta", metavar="GGUF", default=None, help=_META_HELP + " (default: none)")
    _add_common_args(s, ctx=256)
    s.add_argument("--calib-chunks", type=_positive_int, default=None, metavar="N",
                   help="calibration chunks (default: the whole calibration text)")
    s.add_argument("--sens-budget", type=_sens_budget, default=None, metavar="N|KL",
                   help="sprinkle_sensitivity's budget: a number of exact layers, or a KL target (a number with a "
                        "point: add layers until the calibration KL is at most it) (default: 25%% of the layers, "
                        "rounded down)")
    _add_act_args(s)
    _add_transform_args(s, calib=False)
    s.add_argument("--sens-method", choices=("lazy", "greedy", "single"), default="lazy",
                   help="sensitivity search: greedy, lazy greedy, or each layer's gain alone measured once")
    s.add_argument("--sens-chunks", type=_positive_int, default=None, metavar="N",
                   help="calibration chunks of the sensitivity search (default: 2048 tokens' worth, at least 2)")
    s.add_argument("--json", action="store_true",
                   help="print one JSON row per configuration (JSON lines) instead of the table")
    s.add_argument("--json-out", metavar="FILE", default=None,
                   help="also write the JSON rows to FILE (default: not written)")
    s.add_argument("--no-progress", action="store_true", help="no progress bars")
    s.set_defaults(func=_cmd_ffn_sweep)


def add_gate(sub):
    from ..kernels.quant import FOUR_BIT_KINDS

    s = sub.add_parser(
        "gate", help="end to end: tier map -> imatrix -> quantize -> save -> reload -> PPL/KL, and a verdict",
        description="The end-to-end gate: tier map -> imatrix -> quantize -> save -> reload -> PPL and KL\n"
                    "against the source, one table. With no files it runs on a seeded synthetic model.\n\n"
                    "The imatrix never sees the scored tokens: with --calib TEXT that text calibrates;\n"
                    "without it the evaluation text's last --calib-chunks chunks (default: 10% of its\n"
                    "chunks) calibrate and only the chunks before them are scored.\n\n"
                    "Thresholds (--max-dppl, --max-dppl-rel, --max-kld) apply to the main configuration\n"
                    "(ours: alloc + imatrix). The last line is the verdict: 'GATE PASS (...): ...' (exit 0),\n"
                    "'GATE FAIL (...): ...' (exit 1), or 'GATE: no thresholds given (report only)' (exit 0).")
    s.add_argument("model", nargs="?", metavar="MODEL",
                   help="the fp16 (or f32/bf16) source GGUF, or -m/--model; omit MODEL, ALLOC and TEXT for the "
                        "synthetic model")
    s.add_argument("alloc", nargs="?", metavar="ALLOC",
                   help="a llama.cpp mixed GGUF (allocation oracle: its types only) or an emit-map file")
    s.add_argument("text", nargs="?", metavar="TEXT", help="evaluation text (UTF-8), or -f/--file")
    _add_common_args(s, ctx=256, slots=("model", "alloc", "text"), required=False)
    for a in s._actions:
        if a.dest == "chunks":
            a.help = ("score at most N chunks (default: every whole chunk of the text, or without --calib every "
                      "chunk before the held-out calibration part)")
        if a.dest == "ctx":  # why not llama.cpp's 512, which ppl and imatrix default to
            a.help = ("tokens per chunk (default 256: the context of the stories260K figures llama-perplexity "
                      "gives in ../shared and of the synthetic model's tables; ppl and imatrix default to 512, as "
                      "llama.cpp)")
    s.add_argument("--calib", metavar="TEXT", default=None,
                   help="calibration text for the imatrix (default: hold out the evaluation text's last "
                        "--calib-chunks chunks and score only the chunks before them; the synthetic model has its "
                        "own calibration text)")
    s.add_argument("--calib-chunks", type=_positive_int, default=None, metavar="N",
                   help="calibration chunks (default: all of --calib TEXT; without --calib, 10%% of the "
                        "evaluation text's chunks, at least 1)")
    s.add_argument("--kind", choices=FOUR_BIT_KINDS, default="nf4", help="codebook of the int4 tier")
    s.add_argument("--meta", metavar="GGUF", default=None,
                   help=_META_HELP + " (default: ALLOC when it is a GGUF)")
    s.add_argument("--max-dppl", type=_gate_limit, default=None, metavar="X",
                   help="fail (exit 1) if PPL - source PPL of the main configuration exceeds X "
                        "(default: no limit)")
    s.add_argument("--max-dppl-rel", type=_gate_limit, default=None, metavar="F",
                   help="fail (exit 1) if (PPL - source PPL) / source PPL exceeds F, a fraction: 0.02 is 2%% "
                        "(default: no limit)")
    s.add_argument("--max-kld", type=_gate_limit, default=None, metavar="X",
                   help="fail (exit 1) if the mean KL divergence from the source exceeds X nats "
                        "(default: no limit)")
    s.add_argument("--out", metavar="DIR", default=None,
                   help="keep the quantized models, the reference log-probs (and the synthetic model) in DIR "
                        "(default: a temporary folder, removed at the end)")
    s.add_argument("--no-progress", action="store_true", help="no progress bars")
    s.set_defaults(func=_cmd_gate)
