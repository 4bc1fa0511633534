"""orkpy's command line: orkpy COMMAND ... or python -m orkpy COMMAND.

The model-running commands also take llama-perplexity / llama-imatrix
spellings: -m/--model, -f/--file, -c/--ctx-size, -t/--threads, --chunks,
-b/--batch-size, --kl-divergence-base / --kl-divergence.
"""
import argparse
import collections
import json
import os
import sys
import textwrap

from . import __version__
from ._core import NPUError, UnavailableError
from ._io import read_text_like_llama_cpp  # noqa: F401 -- also orkpy.cli.read_text_like_llama_cpp, as before

EPILOG = """\
exit status:
  0    success
  1    runtime failure: a missing, unreadable or malformed file, an output path that
       cannot be written, a failed gate, an NPU error (no device, a driver call, a timeout)
  2    usage error: bad, missing or conflicting arguments
  130  interrupted (Ctrl-C)"""

# what a command can fail with at run time (exit 1); anything else (TypeError, KeyError, ...) is a bug and
# keeps its traceback
_RUNTIME_ERRORS = (ValueError, OSError, NotImplementedError, MemoryError, UnavailableError, NPUError)


class UsageError(ValueError):
    """A command line that cannot run as given (missing or conflicting arguments, a bad value): exit 2."""


class _Formatter(argparse.HelpFormatter):
    """Every option's help ends with its default (unless the text already says it or the option is
    required); in descriptions and the epilog, paragraphs (blank-line separated) are wrapped and a
    paragraph with indented lines (a table) is kept as written."""

    def _fill_text(self, text, width, indent):
        out = []
        for para in text.strip("\n").split("\n\n"):
            lines = para.splitlines()
            if any(line.startswith(" ") for line in lines):
                out.append("\n".join(indent + line for line in lines))
            else:
                out.append(textwrap.fill(" ".join(line.strip() for line in lines), width,
                                         initial_indent=indent, subsequent_indent=indent))
        return "\n\n".join(out)

    def _get_help_string(self, action):
        h = action.help or ""
        if not action.option_strings or action.required or "default" in h or action.default is argparse.SUPPRESS:
            return h
        if isinstance(action, argparse._StoreTrueAction):
            return h + " (default: off)"
        return h + " (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """The parser class of orkpy and of every subcommand: defaults shown, exit status in the epilog."""

    def __init__(self, *args, **kw):
        kw.setdefault("formatter_class", _Formatter)
        kw.setdefault("epilog", EPILOG)
        super().__init__(*args, **kw)


# -m / -f fill the MODEL / TEXT positional slots of the commands that have them
_SLOT_OPTIONS = {"model": ("model_opt", "-m/--model"), "text": ("file_opt", "-f/--file")}


def _add_common_args(s, *, ctx=512, slots=("model", "text"), required=True, even_ctx=True):
    """Add the llama-perplexity / llama-imatrix spellings to subcommand parser ``s``.

    ``slots``: the dests of ``s``'s positional arguments, in order (declare them with ``nargs="?"``);
    -m/--model fills the "model" slot and -f/--file the "text" slot, and the positionals given fill the
    others in order (main() does it, _fill_slots: both spellings of one file, or a missing one when
    ``required``, is a usage error). Also -c/--ctx/--ctx-size (default ``ctx``; an even int >= 4 when
    ``even_ctx``, as perplexity needs), --chunks, -t/--threads and -b/--batch-size (accepted for
    compatibility: orkpy evaluates each chunk in one forward pass, so it never changes a result).
    """
    s.add_argument("-m", "--model", dest="model_opt", metavar="MODEL",
                   help="the model, as llama.cpp spells it (default: the positional MODEL)")
    if "text" in slots:
        s.add_argument("-f", "--file", dest="file_opt", metavar="TEXT",
                       help="the text file, as llama.cpp spells it (default: the positional TEXT)")
    s.add_argument("-c", "--ctx", "--ctx-size", dest="ctx", type=_even_ctx if even_ctx else _positive_int,
                   default=ctx, metavar="N", help="tokens per chunk (context size)")
    s.add_argument("--chunks", type=_positive_int, default=None, metavar="N",
                   help="evaluate at most N chunks (default: every whole chunk of the text)")
    s.add_argument("-t", "--threads", type=_positive_int, default=None, metavar="N",
                   help="worker threads; never changes a result (default: all cores)")
    s.add_argument("-b", "--batch-size", dest="batch_size", type=_positive_int, default=None, metavar="N",
                   help="accepted for llama.cpp compatibility; orkpy evaluates a whole chunk in one pass, so it "
                        "has no effect on results (default: the chunk size)")
    s.set_defaults(_slots=tuple(slots), _slots_required=required)


def _add_transform_args(s, *, calib=True):
    """--rotate / --rotate-online / --smooth (orkpy.rotate) and, with ``calib``, --calib /
    --calib-chunks: the calibration text they and the static activation ranges need."""
    s.add_argument("--rotate", choices=("hadamard",), default=None,
                   help="fold a randomized Hadamard rotation into the weights (QuaRot-style; the float model "
                        "computes the same function) (default: none)")
    s.add_argument("--rotate-online", action="store_true",
                   help="also rotate ffn_down's input online (a fast Walsh-Hadamard per token on the host)")
    s.add_argument("--smooth", type=_smooth_alpha, default=None, metavar="ALPHA",
                   help="SmoothQuant migration strength in [0, 1], scales folded into the norms; needs --calib "
                        "(default: none)")
    if calib:
        s.add_argument("--calib", metavar="TEXT", default=None,
                       help="calibration text for --smooth and the static / outlier activation modes; never the "
                            "scored text (default: none)")
        s.add_argument("--calib-chunks", type=_positive_int, default=8, metavar="N",
                       help="calibration chunks of --ctx tokens (default: 8)")


def _add_act_args(s):
    from .actspec import ACT_MODES
    s.add_argument("--act", choices=ACT_MODES, default="per_token",
                   help="activation mode of the packed linears: one int8 scale per token (dynamic), per forward "
                        "call, static calibrated ranges (the NPU can chain them), or per token with outlier "
                        "channels in float (default: per_token)")
    s.add_argument("--act-calib", metavar="FILE", default=None,
                   help="act_scales.json of an earlier calibration for --act static / per_token_outliers "
                        "(default: a model directory's own, else one run on --calib)")


def _smooth_alpha(v):
    try:
        a = float(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{v!r} is not a number") from None
    if not 0.0 <= a <= 1.0:
        raise argparse.ArgumentTypeError(f"{v} is outside [0, 1]")
    return a


def _transform_kwargs(args, calib_text):
    """load_model / quantize_model keywords of the --rotate / --smooth / --calib flags."""
    if args.smooth is not None and calib_text is None:
        raise UsageError("--smooth needs --calib TEXT: the migration scales come from calibration activations")
    return dict(rotate=args.rotate, rotate_online=args.rotate_online, smooth=args.smooth, calib=calib_text)


def _fill_slots(args):
    """Resolve -m/--model and -f/--file against the positional MODEL / TEXT (see _add_common_args)."""
    slots = getattr(args, "_slots", ())
    given = [getattr(args, d) for d in slots if getattr(args, d) is not None]  # argparse fills a prefix
    by_opt = {d: getattr(args, _SLOT_OPTIONS[d][0]) for d in slots
              if d in _SLOT_OPTIONS and getattr(args, _SLOT_OPTIONS[d][0], None) is not None}
    free = [d for d in slots if d not in by_opt]
    if len(given) > len(free):
        twice = ", ".join(f"{d.upper()} ({_SLOT_OPTIONS[d][1]})" for d in by_opt)
        raise UsageError(f"{twice} given both as an option and as a positional argument: give each file once "
                         f"(positional arguments expected: {' '.join(d.upper() for d in free) or 'none'})")
    for d in slots:
        setattr(args, d, by_opt.get(d))
    for d, v in zip(free, given):
        setattr(args, d, v)
    if getattr(args, "_slots_required", False):
        for d in slots:
            if getattr(args, d) is None:
                alt = f" or with {_SLOT_OPTIONS[d][1]}" if d in _SLOT_OPTIONS else ""
                raise UsageError(f"missing {d.upper()}: give it as a positional argument{alt}")
    if getattr(args, "batch_size", None) is not None and args.batch_size < args.ctx:
        print(f"orkpy {args.command}: note: -b/--batch-size {args.batch_size} is smaller than the context "
              f"{args.ctx}; orkpy evaluates each chunk in one forward pass, so it has no effect on results",
              file=sys.stderr)


def _check_output_path(path, what, *, is_dir=False, overwrite=True):
    """Fail before any work if ``path`` cannot be written, naming the user's path and option ``what``.

    The rule for every output option: missing parent folders are created (as ``quantize -o`` always did);
    an existing folder where a file is wanted, an existing file where a folder is wanted (``is_dir``: the
    output is a folder, which the command itself creates or writes into), an unwritable parent folder, or
    (``overwrite=False``) an existing output are errors (OSError: exit status 1). Returns ``path``.
    """
    path = os.fspath(path)
    full = os.path.abspath(path)
    parent = os.path.dirname(full)
    if os.path.exists(full):
        if not overwrite:
            raise FileExistsError(f"{what} {path}: exists (use --overwrite to replace it)")
        if os.path.isdir(full) != is_dir:
            raise IsADirectoryError(f"{what} {path}: is a folder, expected a file") if not is_dir else \
                NotADirectoryError(f"{what} {path}: is a file, expected a folder")
    up = parent
    while not os.path.exists(up):
        up = os.path.dirname(up)
    if not os.path.isdir(up):
        raise NotADirectoryError(f"{what} {path}: {up} is a file, not a folder")
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        raise type(e)(f"{what} {path}: cannot create the folder {parent} ({e.strerror or e})") from None
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(f"{what} {path}: the folder {parent} is not writable")
    return path


_META_HELP = ("for a safetensors MODEL (a .safetensors file, a shard index or their folder): a GGUF of the same "
              "model for the hyper-parameters and the tokenizer; its tensor data is not used")


def _meta_arg(args, source, fallback=None, what="MODEL"):
    """--meta, checked before any work: the GGUF that supplies a safetensors ``source``'s hyper-parameters and
    tokenizer (``fallback``, e.g. the allocation GGUF, when --meta is not given); None for a GGUF source."""
    from .source import is_safetensors

    meta = getattr(args, "meta", None)
    st = source is not None and is_safetensors(source)
    if meta is not None:
        if not st:
            raise UsageError(f"--meta {meta}: {what} {source} is not a safetensors checkpoint (a GGUF or a model "
                             "folder carries its own metadata); --meta is for safetensors sources only")
        if not os.path.isfile(meta):
            raise FileNotFoundError(f"--meta {meta}: no such file")
        if not meta.endswith(".gguf"):
            raise UsageError(f"--meta {meta}: expected a GGUF file (.gguf) of the same model")
        return meta
    if st and fallback is None:
        raise UsageError(f"{what} {source} is a safetensors checkpoint: give --meta GGUF, a GGUF of the same model "
                         "for the hyper-parameters and the tokenizer")
    return fallback if st else None


def _warn_ctx(n_ctx_train, ctx, command):
    """A warning on stderr when the context is longer than the model was trained for."""
    if n_ctx_train and ctx > n_ctx_train:
        print(f"orkpy {command}: warning: --ctx {ctx} is longer than the model's trained context "
              f"{n_ctx_train} (context_length); results past it are not meaningful", file=sys.stderr)


def _cmd_info(args):
    from .cpu import capabilities
    from .npu import BACKENDS, unavailable

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
    mid_c = "".join(f", {t} {c[t]}" for t in ("int6", "int5") if c.get(t))  # only when the map has them
    mid_b = "".join(f", {t} {b[t]:,}" for t in ("int6", "int5") if b.get(t))
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


def _weights_arg(spec):
    """--weights: a path name, an emit-map file, or a GGUF whose types allocate the tiers."""
    from .model import PATHS
    from .source import read_allocation
    if spec in PATHS:
        return spec
    if not os.path.exists(spec):
        raise UsageError(f"--weights {spec!r} is neither a path name ({', '.join(PATHS)}) nor a file")
    return read_allocation(spec).tiers


_PACKED_WEIGHTS = "int8, nf4, int4, an emit-map file or an allocation GGUF with int8/int4 tiers"


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
    from .actspec import ACT_MODE_INFO
    from .model import load_model
    from .ppl import perplexity

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
    if ACT_MODE_INFO[args.act].calibrated and calib is None and args.act_calib is None \
            and not os.path.isdir(args.model):
        raise UsageError(f"--act {args.act} needs calibrated activations: --calib TEXT (a text that is not scored) "
                         "or --act-calib act_scales.json")
    model = load_model(args.model, weights=weights, int4_kind=args.int4_kind, threads=args.threads, meta=meta,
                       act=args.act, act_calib=args.act_calib, calib_ctx=args.ctx, calib_chunks=args.calib_chunks,
                       **_transform_kwargs(args, calib))
    _warn_ctx(model.hparams.get("n_ctx_train"), args.ctx, args.command)
    if args.npu:
        from . import npu
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


def _cmd_imatrix(args):
    from .calibrate import collect_imatrix
    from .model import load_model

    _check_output_path(args.output, "-o/--output")
    meta = _meta_arg(args, args.model)
    text = read_text_like_llama_cpp(args.text)
    model = load_model(args.model, threads=args.threads, meta=meta)
    _warn_ctx(model.hparams.get("n_ctx_train"), args.ctx, args.command)
    im = collect_imatrix(model, text, n_ctx=args.ctx, chunks=args.chunks,
                         threads=args.threads, progress=not args.no_progress)
    im.datasets = [os.path.basename(args.text)]
    im.save(args.output)  # the format follows the extension: .dat legacy, else GGUF
    print(f"imatrix of {len(im.names())} tensors over {im.chunks} chunks of {args.ctx} -> {args.output}")
    return 0


def _cmd_quantize(args):
    from .calibrate import quantize_model

    _check_output_path(args.output, "-o/--output", is_dir=True, overwrite=args.overwrite)
    out_dir = os.path.abspath(args.output)
    if os.path.isdir(out_dir) and os.listdir(out_dir) and not os.path.isfile(os.path.join(out_dir, "manifest.json")):
        raise FileExistsError(f"-o/--output {args.output}: a non-empty folder that is not an orkpy model directory "
                              "(no manifest.json); --overwrite replaces only a model directory")
    if (args.alloc is None) == (args.target_bpw is None):
        raise ValueError("give exactly one of --alloc (an allocation oracle or emit-map) and --target-bpw (a size)")
    if args.emit_map:
        _check_output_path(args.emit_map, "--emit-map")
    meta = _meta_arg(args, args.source, fallback=args.alloc if (args.alloc or "").endswith(".gguf") else None,
                     what="SOURCE")
    calib = read_text_like_llama_cpp(args.calib) if args.calib else None
    qm = quantize_model(args.source, args.alloc, imatrix=args.imatrix, kind=args.kind, sr=args.sr, seed=args.seed,
                        threshold=args.threshold, threads=args.threads, progress=not args.no_progress, meta=meta,
                        calib_ctx=args.calib_ctx, calib_chunks=args.calib_chunks, method=args.method,
                        awq=args.awq, group_size=args.group_size, target_bpw=args.target_bpw,
                        clip_search=args.clip_search, tied_lookup=args.tied_lookup, gptq_sequential=args.gptq_sequential,
                        output=args.output, overwrite=args.overwrite,  # streamed: one tensor in memory at a time
                        fallback="literal" if args.literal_types else "infer",
                        **_transform_kwargs(args, calib))
    out = qm.path
    if args.emit_map and qm.alloc_map is not None:
        qm.alloc_map.save(args.emit_map)
        print(f"wrote the allocation to {args.emit_map}")
    b = qm.result_bytes()
    mid = "".join(f", {t} {b[t]:,} bytes" for t in ("int6", "int5") if b.get(t))
    print(f"{qm}\nwrote {out} (int8 {b['int8']:,} bytes{mid}, int4 {b['int4']:,} bytes; "
          f"int8 share of weight storage {qm.int8_share():.1%})")
    return 0


def _cmd_ffn_sweep(args):
    from .ffn import sweep
    from .gguf import GGUFFile
    from .source import hparams

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
        from ._io import atomic_write
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


def _cmd_dequantize(args):
    from .convert import dequantize_gguf

    _check_output_path(args.output, "-o/--output", overwrite=args.overwrite)
    if os.path.exists(args.output) and os.path.samefile(args.file, args.output):
        raise UsageError(f"-o/--output {args.output} is the source file itself: give another name")
    types = dequantize_gguf(args.file, args.output, threads=args.threads)
    what = f"dequantized {', '.join(types)} tensors" if types else "no quantized tensors: copied as F32"
    print(f"wrote {args.output}: every tensor F32 ({what}; the exact dequantization of {args.file})")
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


def _gate_limit(s):
    v = float(s)
    if not v >= 0.0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {s}")
    return v


def _cmd_gate(args):
    import tempfile

    from .gate import format_gate, run_gate, verdict

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
            from .synthetic import make_synthetic
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


def _cmd_generate(args):
    from .generate import generate
    from .model import load_model

    if (args.prompt is None) == (args.file is None):
        raise UsageError("give the prompt once: -p/--prompt TEXT or -f/--file FILE")
    prompt = args.prompt if args.file is None else read_text_like_llama_cpp(args.file)
    model = load_model(args.model, weights=_weights_arg(args.weights), int4_kind=args.int4_kind, threads=args.threads)
    st = {}
    for piece in generate(model, prompt, args.n_predict, args.temp, args.top_k, args.top_p, args.seed, stream=True,
                          chat=args.chat, threads=args.threads, n_ctx=args.ctx, stats=st):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()
    rate = lambda n, t: f"{n / t:.1f} tokens/s" if t > 0 else "-"  # noqa: E731
    print(f"orkpy generate: {model}; prompt {st['n_prompt']} tokens ({rate(st['n_prompt'], st.get('t_prompt', 0))}), "
          f"{st['n_gen']} generated ({rate(st['n_decode'], st['t_decode'])} decoding), stop: "
          f"{'end of generation' if st['stop'] == 'eog' else '-n reached'}", file=sys.stderr)
    return 0


def _int_arg(minimum, what, even=False):
    """An argparse type: an integer >= minimum (and even, if asked), else a usage error saying ``what``."""
    def parse(s):
        v = int(s)
        if v < minimum or (even and v % 2):
            raise argparse.ArgumentTypeError(f"must be {what}, got {s}")
        return v
    return parse


_positive_int = _int_arg(1, "a positive integer")
_count = _int_arg(0, "an integer >= 0")


def _temperature(s):
    v = float(s)
    if not 0.0 <= v < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0 (0: greedy), got {s}")
    return v


def _top_p(s):
    v = float(s)
    if not 0.0 < v <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {s}")
    return v
_even_ctx = _int_arg(4, "an even integer >= 4 (the second half of a chunk is scored)", even=True)
_ctx_size = _int_arg(2, "an integer >= 2")


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


def _threshold(s):
    v = float(s)
    if not 0.0 < v < 64.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 64) bits per weight, got {s}")
    return v


_MODEL_HELP = "GGUF model, a safetensors checkpoint (with --meta) or a quantized model folder; or -m/--model"
_TEXT_HELP = "UTF-8 text file, one trailing newline dropped as llama-perplexity -f does; or -f/--file"


def build_parser():
    from .npu import BACKENDS
    from .quant import CLIP_SEARCHES, FOUR_BIT_KINDS  # the int4 tier's codebooks, from the C kind registry

    p = _Parser(prog="orkpy", description=__doc__)
    p.add_argument("--version", action="version", version=f"orkpy {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    s = sub.add_parser("generate", help="generate text from a prompt (KV-cached decode), streamed to stdout",
                       description="The continuation of a prompt, written to stdout as it comes (orkpy.generate: "
                                   "llama.cpp's top-k -> top-p -> temperature order, numpy's default_rng(seed)); "
                                   "timings on stderr. Stops at -n tokens or an end-of-generation token.")
    s.add_argument("model", nargs="?", metavar="MODEL", help=_MODEL_HELP)
    s.add_argument("-m", "--model", dest="model_opt", metavar="MODEL",
                   help="the model, as llama.cpp spells it (default: the positional MODEL)")
    s.add_argument("-p", "--prompt", default=None, help="the prompt text (default: -f)")
    s.add_argument("-f", "--file", default=None, metavar="FILE", help="read the prompt from FILE (default: -p)")
    s.add_argument("-n", "--n-predict", type=_count, default=128, metavar="N", help="tokens to generate at most")
    s.add_argument("--temp", type=_temperature, default=0.8, metavar="T", help="temperature; 0 is greedy")
    s.add_argument("--top-k", type=_count, default=40, metavar="K", help="keep the K most likely tokens; 0: all")
    s.add_argument("--top-p", type=_top_p, default=0.95, metavar="P", help="nucleus: keep the smallest set of "
                   "probability >= P")
    s.add_argument("-s", "--seed", type=_count, default=0, metavar="S", help="sampling seed (the same seed, the "
                   "same text)")
    s.add_argument("--chat", action="store_true", help="the prompt is a user message in the model's chat template "
                   "(ChatML, Gemma, Llama-3: tokenizer.chat_template)")
    s.add_argument("-c", "--ctx-size", dest="ctx", type=_positive_int, default=None, metavar="N",
                   help="positions of the KV cache (default: the prompt's tokens + N)")
    s.add_argument("-t", "--threads", type=_positive_int, default=None, metavar="N",
                   help="worker threads; never changes a result (default: all cores)")
    s.add_argument("--weights", default="gguf",
                   help="fp32|gguf|int8|nf4|int4, an emit-map file, or a mixed GGUF used as allocation oracle")
    s.add_argument("--int4-kind", choices=FOUR_BIT_KINDS, default="nf4",
                   help="codebook of the int4-tier linears when --weights is a map or an allocation")
    s.set_defaults(func=_cmd_generate, _slots=("model",), _slots_required=True)

    s = sub.add_parser("info", help="CPU features, the kernels in use and the NPU backends")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=_cmd_info)

    s = sub.add_parser("quant-report", help="reconstruction error of every kind on seeded weights")
    s.add_argument("--rows", type=_positive_int, default=1024, help="rows (N) of the test weights")
    s.add_argument("--cols", type=_positive_int, default=4096, help="columns (K) of the test weights")
    s.add_argument("--seed", type=int, default=0, help="seed of the test weights")
    s.add_argument("-t", "--threads", type=_positive_int, default=None,
                   help="worker threads; never changes a result (default: all cores)")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=_cmd_quant_report)

    s = sub.add_parser("ppl", help="perplexity with llama-perplexity's method (and KL-divergence mode)")
    s.add_argument("model", nargs="?", metavar="MODEL", help=_MODEL_HELP)
    s.add_argument("text", nargs="?", metavar="TEXT", help=_TEXT_HELP)
    _add_common_args(s, ctx=512)
    s.add_argument("--meta", metavar="GGUF", default=None, help=_META_HELP + " (default: none)")
    s.add_argument("--weights", default="gguf",
                   help="fp32|gguf|int8|nf4|int4, an emit-map file, or a mixed GGUF used as allocation oracle")
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

    s = sub.add_parser("imatrix", help="collect an importance matrix in the forward pass")
    s.add_argument("model", nargs="?", metavar="MODEL", help=_MODEL_HELP)
    s.add_argument("text", nargs="?", metavar="TEXT", help=_TEXT_HELP)
    s.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="FILE.dat: the legacy .dat; any other name: llama.cpp's GGUF imatrix (required)")
    s.add_argument("--meta", metavar="GGUF", default=None, help=_META_HELP + " (default: none)")
    _add_common_args(s, ctx=512, even_ctx=False)
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    s.set_defaults(func=_cmd_imatrix)

    s = sub.add_parser("quantize", help="quantize a model: fp16 source + allocation (+ imatrix) -> model directory")
    s.add_argument("source", help="F32/F16/BF16 GGUF or safetensors checkpoint (a quantized GGUF here means "
                                  "double-quant, said loudly)")
    s.add_argument("--alloc", default=None,
                   help="a llama.cpp mixed GGUF (its types only) or an emit-map file (default: none; required unless "
                        "--target-bpw)")
    s.add_argument("--meta", metavar="GGUF", default=None,
                   help=_META_HELP + " (default: the --alloc GGUF; required for a safetensors SOURCE with an "
                                     "emit-map --alloc)")
    s.add_argument("--imatrix", default=None,
                   help="imatrix file, .dat or GGUF, llama.cpp's or orkpy's (default: none, plain absmax scales)")
    s.add_argument("--kind", choices=FOUR_BIT_KINDS, default="nf4", help="codebook of the int4 tier")
    s.add_argument("--sr", action="store_true", help="stochastic rounding")
    s.add_argument("--seed", type=int, default=0, help="seed of the stochastic rounding")
    s.add_argument("--clip-search", choices=CLIP_SEARCHES, default="screen",
                   help="with --imatrix: the 4-bit clip search on rows of >= 512 inputs, screened by a histogram "
                        "(1.0 and the three best estimates evaluated exactly) or every ratio evaluated "
                        "(default: screen; see orkpy.quantize)")
    s.add_argument("--threshold", type=_threshold, default=5.0,
                   help="bits/weight at or above which an allocation type is int8")
    s.add_argument("-t", "--threads", type=_positive_int, default=None,
                   help="worker threads; never changes a result (default: all cores)")
    _add_transform_args(s)
    s.add_argument("--method", choices=("rtn", "gptq"), default="rtn",
                   help="rounding of every packed tier: round to nearest, or GPTQ error feedback on the input "
                        "Gram matrices of --calib (default: rtn)")
    s.add_argument("--literal-types", action="store_true",
                   help="read a GGUF --alloc's fallback types literally (the stored type, not the type llama.cpp "
                        "intended; see orkpy tier-map)")
    s.add_argument("--gptq-sequential", action="store_true",
                   help="with --method gptq: calibrate layer by layer, each layer's Gram matrices taken on the "
                        "outputs of the already-quantized layers before it (slower; default: all layers on the "
                        "float model)")
    s.add_argument("--awq", action="store_true",
                   help="AWQ-style per-input-channel scales searched on --calib and folded into the norms and "
                        "producing linears before rounding (default: off)")
    s.add_argument("--group-size", type=_positive_int, default=None, metavar="N",
                   help="group-wise scales, one per N inputs (a multiple of 32) for every packed linear whose tier "
                        "names none (default: one scale per output channel)")
    s.add_argument("--target-bpw", type=float, default=None, metavar="X",
                   help="choose the tiers (int4, int4-g128/64/32, int8) for X bits per linear weight from "
                        "sensitivities measured on --calib, instead of --alloc (default: off)")
    s.add_argument("--tied-lookup", choices=("float", "packed"), default="float",
                   help="a tied model's embedding lookup: from a float copy of the table (stored twice) or from the "
                        "packed head's rows (stored once) (default: float)")
    s.add_argument("--emit-map", default=None, metavar="FILE",
                   help="write the allocation used (with --target-bpw: the one chosen) as an emit-map file "
                        "(default: not written)")
    s.add_argument("--calib-ctx", type=_positive_int, default=512, metavar="N",
                   help="tokens per calibration chunk (default: 512); with --calib the static activation ranges "
                        "and outlier channels are calibrated and saved with the model (act_scales.json)")
    s.add_argument("-o", "--output", required=True, metavar="DIR",
                   help="output model folder; missing parent folders are created (required)")
    s.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    s.set_defaults(func=_cmd_quantize)

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

    s = sub.add_parser("dequantize", help="the float reference of a quantized GGUF: every tensor as F32, exactly "
                                          "as its type decodes")
    s.add_argument("file", metavar="MODEL", help="a GGUF (any of the ggml types orkpy reads)")
    s.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="the F32 GGUF to write (the metadata copied, general.file_type 0); required")
    s.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    s.add_argument("-t", "--threads", type=_positive_int, default=None,
                   help="worker threads; never changes a result (default: all cores)")
    s.set_defaults(func=_cmd_dequantize)

    s = sub.add_parser("npu-dump", help="decode an RK3588 NPU register command buffer into a listing")
    s.add_argument("file", help="little-endian binary qwords, or text with one hex qword per line")
    s.set_defaults(func=_cmd_npu_dump)

    s = sub.add_parser("npu-plan", help="how an int8 matmul is split into NPU tasks (and its command stream)")
    s.add_argument("M", type=_positive_int, help="rows of the activations")
    s.add_argument("K", type=_positive_int, help="inputs (the contracted dimension)")
    s.add_argument("N", type=_positive_int, help="outputs")
    for cap in ("max_m", "max_k", "max_n"):
        s.add_argument("--" + cap.replace("_", "-"), dest=cap, type=int, default=0,
                       help="lower per-task cap, to force chains in tests (default: 0, the hardware limit)")
    s.add_argument("--limit", type=_positive_int, default=20, help="tasks listed")
    s.add_argument("--dump", action="store_true", help="also print the chained command listing")
    s.add_argument("--json", action="store_true", help="print the plan as JSON")
    s.set_defaults(func=_cmd_npu_plan)

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

    s = sub.add_parser("gguf-info", help="header, metadata and tensor table of a GGUF file")
    s.add_argument("file", help="a GGUF file")
    s.set_defaults(func=_cmd_gguf_info)

    s = sub.add_parser("tier-map", help="int8/int4 tier per tensor from a mixed GGUF's types")
    s.add_argument("--literal-types", action="store_true",
                   help="tier tensors that llama-quantize stored on a fallback type (rows not a multiple of 256) by "
                        "the stored type, not the type llama.cpp intended (default: intended)")
    tiers = ["by_type", "int8", "int4", "float"]
    s.add_argument("file", help="a (mixed) GGUF: its tensor types decide the tiers")
    s.add_argument("--threshold", type=_threshold, default=5.0, help="bits/weight at or above which a type is int8")
    s.add_argument("--embeddings", choices=tiers, default="by_type", help="tier of the embedding table")
    s.add_argument("--output-tier", "--head", dest="output_tier", choices=tiers, default="by_type",
                   help="tier of the LM head (output.weight)")
    s.add_argument("--output", dest="output_tier", choices=tiers, help=argparse.SUPPRESS)  # the old spelling
    s.add_argument("--emit-map", metavar="OUT", default=None,
                   help="write the tier map, emit-map text format (default: not written)")
    s.set_defaults(func=_cmd_tier_map)
    return p


def main(argv=None):
    """Run one command; returns the exit status (see EPILOG). argparse's own usage errors exit 2 through
    SystemExit; TypeError, KeyError and the like are bugs and keep their traceback."""
    who = "orkpy"
    try:
        args = build_parser().parse_args(argv)
        who = f"orkpy {args.command}"
        _fill_slots(args)
        return args.func(args)
    except UsageError as e:
        print(f"{who}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{who}: interrupted", file=sys.stderr)
        return 130
    except (NPUError, UnavailableError) as e:  # no device, a driver call failed, a timeout
        print(f"{who}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except _RUNTIME_ERRORS as e:
        print(f"{who}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
