"""The commands that write weights: imatrix, quantize, dequantize; and recipe, which prints the recipe a
quantize command line means (docs/recipes.md)."""
import argparse
import copy
import json
import os
import sys

from ..quantization.alloc import DEFAULT_OPTIONS
from ..quantization.npu_alloc import NPU_OPTIONS
from ..quantization.recipe import GPTQ_PRECISIONS, METHODS, TIED_LOOKUPS
from ._common import (_META_HELP, _MODEL_HELP, _TEXT_HELP, UsageError, _add_common_args, _add_transform_args,
                      _check_output_path, _meta_arg, _positive_int, _threshold, _warn_ctx,
                      read_text_like_llama_cpp)

def _cmd_imatrix(args):
    from ..quantization.calibrate import collect_imatrix
    from ..runtime.model import load_model

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


# ``orkpy quantize`` option (its dest) -> recipe key path (orkpy.quantization.recipe); the value converted by _CLI_CONVERT
CLI_KEYS = {
    "rotate": "transform.rotate", "rotate_online": "transform.rotate_online", "smooth": "transform.smooth",
    "calib_ctx": "calibration.ctx", "calib_chunks": "calibration.chunks",
    "threshold": "allocation.threshold", "literal_types": "allocation.fallback",
    "target_bpw": "allocation.target_bpw", "npu_bits": "allocation.npu_bits", "npu_tiers": "allocation.npu_options",
    "npu_per_group": "allocation.npu_per_linear", "act_groups": "activation.groups",
    "kind": "allocation.kind",
    "group_size": "allocation.group_size",
    "tied_lookup": "allocation.tied_lookup",
    "method": "rounding.method", "gptq_sequential": "rounding.gptq_sequential",
    "gptq_precision": "rounding.gptq_precision", "awq": "rounding.awq",
    "sr": "rounding.sr", "seed": "rounding.seed", "clip_search": "rounding.clip_search",
    "symmetric": "rounding.symmetric",
}
# what --npu-bits sets unless the command line (or --recipe) says otherwise: the rotations the int4
# activations need, GPTQ, activations scaled per weight group and affine int4 groups (docs/w4a4.md)
NPU_DEFAULTS = {"rotate": "hadamard", "rotate_online": True, "method": "gptq", "act_groups": True, "symmetric": False}
_CLI_CONVERT = {"literal_types": lambda v: "literal" if v else "infer", "npu_tiers": list,
                "npu_per_group": lambda v: not v}
# ``orkpy quantize`` options that are inputs, outputs or run settings: never part of a recipe
CLI_NOT_RECIPE = frozenset({"help", "source", "alloc", "meta", "imatrix", "calib", "threads", "emit_map", "output",
                            "overwrite", "no_progress", "no_resume", "recipe"})


def _given_options(args):
    """The dests of the recipe options the command line gave (not left at their defaults): the
    subcommand's arguments parsed again into a namespace where every option is unset."""
    parser, argv = getattr(args, "_cmd_parser", None), getattr(args, "_argv", None)
    if parser is None or argv is None or args.command not in argv:
        return None
    unset = object()
    ns = argparse.Namespace(**{a.dest: unset for a in parser._actions if a.dest != argparse.SUPPRESS})
    parser.parse_known_args(argv[argv.index(args.command) + 1:], ns)
    return {d for d, v in vars(ns).items() if v is not unset}


def _online_rotation_fits(args):
    """Whether SOURCE's n_ff has a Hadamard order (the online down rotation; stories260K's 172 has none).
    An unreadable source says yes: quantize_model then names what is wrong with it."""
    from ..formats.source import open_source
    from ..runtime.rotate import hadamard_factors
    try:
        n_ff = open_source(args.source, getattr(args, "meta", None)).hp.get("n_ff")
    except Exception:  # noqa: BLE001 - reported by the quantization itself
        return True
    return not isinstance(n_ff, int) or hadamard_factors(n_ff) is not None


def recipe_from_args(args):
    """The recipe (orkpy.Recipe) a quantize / recipe command line means: --recipe FILE (a recipe, or a
    model directory whose recipe is re-run; none: the defaults) with the recipe options given on the
    command line on top (without --recipe, every recipe option's value, defaults included)."""
    from ..quantization.named import resolve_recipe
    from ..quantization.recipe import Recipe, RecipeError

    base = resolve_recipe(args.recipe) if args.recipe is not None else Recipe()
    given = _given_options(args) if args.recipe is not None else None
    d = base.to_dict()
    for dest, path in CLI_KEYS.items():
        if hasattr(args, dest) and (given is None or dest in given):
            sec, key = path.split(".")
            d[sec][key] = _CLI_CONVERT.get(dest, lambda v: v)(getattr(args, dest))
    if getattr(args, "npu_bits", None) is not None:  # the W4A4 machinery is --npu-bits' default
        typed, base_d, default_d = _given_options(args) or set(), base.to_dict(), Recipe().to_dict()
        for dest, value in NPU_DEFAULTS.items():  # unless typed, or set by the --recipe file
            sec, key = CLI_KEYS[dest].split(".")
            if dest not in typed and base_d[sec][key] == default_d[sec][key] and \
                    (dest != "rotate_online" or _online_rotation_fits(args)):
                d[sec][key] = value
    try:
        return Recipe.from_dict(d)
    except RecipeError as e:
        flags = [f"--{k.replace('_', '-')}" for k, p in CLI_KEYS.items() if p == e.key]
        raise RecipeError(e.key, e.message + (f" (option {flags[0]})" if flags else "")) from None


def _cmd_quantize(args):
    from ..quantization.calibrate import quantize_model
    from ..formats.modeldir import check_replaceable
    from ..formats.tiermap import INT_TIERS

    recipe = recipe_from_args(args)  # before any other work: a malformed recipe names its key and line
    _check_output_path(args.output, "-o/--output", is_dir=True, overwrite=args.overwrite)
    try:  # --overwrite replaces only an orkpy model directory (or an empty folder), checked before any work
        check_replaceable(args.output)
    except OSError as e:
        raise type(e)(f"-o/--output {e}") from None
    chosen = (recipe.allocation.target_bpw is not None) + (recipe.allocation.npu_bits is not None)
    if (args.alloc is not None) + chosen != 1:
        raise ValueError("give exactly one of --alloc (an allocation oracle or emit-map), --target-bpw (a size) and "
                         "--npu-bits (an NPU budget)"
                         + (" (or the recipe's allocation.target_bpw / npu_bits)" if args.recipe is not None else ""))
    if args.emit_map:
        _check_output_path(args.emit_map, "--emit-map")
    meta = _meta_arg(args, args.source, fallback=args.alloc if (args.alloc or "").endswith(".gguf") else None,
                     what="SOURCE")
    if recipe.transform.smooth is not None and args.calib is None:
        raise UsageError("--smooth needs --calib TEXT: the migration scales come from calibration activations")
    calib = read_text_like_llama_cpp(args.calib) if args.calib else None
    qm = quantize_model(args.source, args.alloc, imatrix=args.imatrix, threads=args.threads,
                        progress=not args.no_progress, meta=meta, calib=calib, recipe=recipe,
                        output=args.output, overwrite=args.overwrite,  # streamed: one tensor in memory at a time
                        resume=not getattr(args, "no_resume", False))
    out = qm.path
    if args.emit_map and qm.alloc_map is not None:
        qm.alloc_map.save(args.emit_map)
        print(f"wrote the allocation to {args.emit_map}")
    b = qm.result_bytes()
    mid = "".join(f", {t} {b[t]:,} bytes" for t in INT_TIERS if t not in ("int8", "int4") and b.get(t))
    print(f"{qm}\nwrote {out} (int8 {b['int8']:,} bytes{mid}, int4 {b['int4']:,} bytes; "
          f"int8 share of weight storage {qm.int8_share():.1%})")
    print(size_line(out, qm))
    return 0


def size_line(out, qm):
    """The closing line's sizes: the model directory on disk (float.gguf apart: the float tensors and,
    for a tied model, the embedding table unless --tied-lookup packed) and the NPU weight bytes per token."""
    from ..formats.modeldir import FLOAT_FILE
    files = {fn: os.path.getsize(os.path.join(out, fn)) for fn in os.listdir(out)
             if os.path.isfile(os.path.join(out, fn))}
    total, fl = sum(files.values()), files.get(FLOAT_FILE, 0)
    nb, nw = qm.npu_bytes()
    line = (f"size: {total / 1e6:.2f} MB on disk ({FLOAT_FILE} {fl / 1e6:.2f} MB of it); NPU weight bytes per token "
            f"{nb / 1e6:.2f} MB ({8 * nb / max(nw, 1):.2f} bits per packed weight; the NPU reads every 8-bit-activation "
            "tier as int8)")
    if qm.tied and qm.settings.get("tied_lookup") != "packed" and fl > total / 4:
        line += ("\nnote: float.gguf holds the tied embedding table as well as the packed head; --tied-lookup packed "
                 "stores it once (the lookup dequantizes the packed rows)")
    return line


def _cmd_recipe(args):
    text = recipe_from_args(args).dumps(args.format)
    if args.output is None:
        sys.stdout.write(text)
        return 0
    from .._io import atomic_write
    _check_output_path(args.output, "-o/--output")
    atomic_write(args.output, [text.encode()])
    print(f"wrote the recipe to {args.output}", file=sys.stderr)
    return 0


def _cmd_dequantize(args):
    from ..formats.convert import dequantize_gguf

    _check_output_path(args.output, "-o/--output", overwrite=args.overwrite)
    if os.path.exists(args.output) and os.path.samefile(args.file, args.output):
        raise UsageError(f"-o/--output {args.output} is the source file itself: give another name")
    types = dequantize_gguf(args.file, args.output, threads=args.threads)
    what = f"dequantized {', '.join(types)} tensors" if types else "no quantized tensors: copied as F32"
    print(f"wrote {args.output}: every tensor F32 ({what}; the exact dequantization of {args.file})")
    return 0


def add_imatrix(sub):
    s = sub.add_parser("imatrix", help="collect an importance matrix in the forward pass")
    s.add_argument("model", nargs="?", metavar="MODEL", help=_MODEL_HELP)
    s.add_argument("text", nargs="?", metavar="TEXT", help=_TEXT_HELP)
    s.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="FILE.dat: the legacy .dat; any other name: llama.cpp's GGUF imatrix (required)")
    s.add_argument("--meta", metavar="GGUF", default=None, help=_META_HELP + " (default: none)")
    _add_common_args(s, ctx=512, even_ctx=False)
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    s.set_defaults(func=_cmd_imatrix)


def add_quantize(sub):
    from ..kernels.quant import CLIP_SEARCHES, FOUR_BIT_KINDS

    s = sub.add_parser("quantize", help="quantize a model: fp16 source + allocation (+ imatrix) -> model directory")
    s.add_argument("source", help="F32/F16/BF16 GGUF or safetensors checkpoint (a quantized GGUF here means "
                                  "double-quant, said loudly)")
    s.add_argument("--alloc", default=None,
                   help="a llama.cpp mixed GGUF (its types only) or an emit-map file (default: none; required unless "
                        "--target-bpw or --npu-bits)")
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
    _add_transform_args(s, ctx_option="--calib-ctx")
    s.add_argument("--method", choices=METHODS, default="rtn",
                   help="rounding of every packed tier: round to nearest, or GPTQ error feedback on the input "
                        "Gram matrices of --calib (default: rtn)")
    s.add_argument("--literal-types", action="store_true",
                   help="read a GGUF --alloc's fallback types literally (the stored type, not the type llama.cpp "
                        "intended; see orkpy tier-map)")
    s.add_argument("--gptq-sequential", action="store_true",
                   help="with --method gptq: calibrate layer by layer, each layer's Gram matrices taken on the "
                        "outputs of the already-quantized layers before it (slower; default: all layers on the "
                        "float model)")
    s.add_argument("--gptq-precision", choices=GPTQ_PRECISIONS, default="float64",
                   help="with --method gptq: the arithmetic of its factor and error feedback; float32 is about "
                        "twice as fast and needs half the memory (default: float64)")
    s.add_argument("--awq", action="store_true",
                   help="AWQ-style per-input-channel scales searched on --calib and folded into the norms and "
                        "producing linears before rounding (default: off)")
    s.add_argument("--group-size", type=_positive_int, default=None, metavar="N",
                   help="group-wise scales, one per N inputs (a multiple of 32) for every packed linear whose tier "
                        "names none (default: one scale per output channel)")
    s.add_argument("--target-bpw", type=float, default=None, metavar="X",
                   help=f"choose the tiers ({', '.join(DEFAULT_OPTIONS)}) for X bits per linear weight from "
                        "sensitivities measured on --calib, instead of --alloc (default: off)")
    s.add_argument("--npu-bits", type=float, default=None, metavar="X",
                   help="choose W4A4 / W4A8 (the NPU's int4 x int4 mode) or W8A8 per linear for X NPU bits per "
                        "weight on average (4: every linear at 4 bits, 8: every linear W8A8; --npu-tiers) from "
                        "sensitivities measured on "
                        "--calib, instead of --alloc; unless given otherwise also --rotate hadamard --rotate-online "
                        "--method gptq (docs/w4a4.md) (default: off)")
    s.add_argument("--npu-tiers", nargs="+", default=list(NPU_OPTIONS), metavar="TIER",
                   help="the tiers --npu-bits chooses from, int8 last: w4a4 (4-bit activations), w4a8 (int8 "
                        "activations as two int4 digits; 4 NPU bits too), either with group-wise weight scales "
                        "(w4a8-g32: one per 32 inputs, a multiple of 32 up to 480), int8 (default: w4a4 w4a8 int8)")
    s.add_argument("--npu-per-group", action="store_true",
                   help="with --npu-bits: one tier per input group (q/k/v; gate/up) instead of w4a8 / int8 per linear "
                        "inside a group; about a third fewer sensitivity passes (default: per linear)")
    s.add_argument("--act-groups", action=argparse.BooleanOptionalAction, default=False,
                   help="a linear with group-wise weight scales (w4a4-g32, ...) scales its activations per token and "
                        "weight group too, not once per token: no NPU bytes, the host scales each group's block "
                        "anyway (default: on with --npu-bits, else off)")
    s.add_argument("--symmetric", action=argparse.BooleanOptionalAction, default=True,
                   help="--no-symmetric: the NPU's int4 tiers with a group size (w4a4-g32, w4a8-g32) give each group a "
                        "float16 offset beside its scale (affine groups, codes -8..7; the NPU reads the same 4 bits a "
                        "weight, the host adds offset x the group's activation sum); other tiers stay symmetric "
                        "(default: symmetric, but --no-symmetric with --npu-bits)")
    s.add_argument("--tied-lookup", choices=TIED_LOOKUPS, default="float",
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
    s.add_argument("--no-resume", action="store_true",
                   help="with --calib: no checkpoint (by default each finished layer is saved in "
                        "DIR.orkpy-checkpoint, and a killed run given the same inputs continues from there)")
    _add_recipe_arg(s)
    s.set_defaults(func=_cmd_quantize, _cmd_parser=s)
    return s


def _add_recipe_arg(s):
    from ..quantization.named import NAMED
    s.add_argument("--recipe", metavar="NAME|FILE", default=None,
                   help=f"a named recipe ({', '.join(NAMED)}: what was measured to work, docs/recipes.md), a "
                        "quantization recipe file (JSON; TOML on Python 3.11+), or a model directory "
                        "whose recipe is run again; the recipe options given on the command line override its keys "
                        "(default: none, the options alone; `orkpy recipe` prints what they mean)")


def add_recipe(sub):
    """orkpy recipe: quantize's recipe options (the same argparse actions), --recipe, --format, -o."""
    from ._common import _Parser

    s = sub.add_parser("recipe", help="print the quantization recipe a set of quantize options means (JSON or "
                                      "TOML), reading no model",
                       description="The recipe (docs/recipes.md) that `orkpy quantize` would run with these options: "
                                   "every key written, defaults included. With --recipe FILE, that recipe with the "
                                   "options given here on top.")
    from ..quantization.recipe import Recipe

    holder = _Parser(prog="orkpy").add_subparsers()
    quantize = add_quantize(holder)
    default = Recipe().to_dict()
    for action in quantize._actions:  # quantize's own options (type, choices, default): one definition
        if action.dest in CLI_KEYS:
            sec, key = CLI_KEYS[action.dest].split(".")
            action = copy.copy(action)  # the help names the key, not quantize's inputs (--calib, --imatrix)
            action.help = f"sets {sec}.{key}, as in orkpy quantize (default: {json.dumps(default[sec][key])})"
            s._add_action(action)
    _add_recipe_arg(s)
    s.add_argument("--format", choices=("json", "toml"), default="json", help="the text format")
    s.add_argument("-o", "--output", metavar="FILE", default=None,
                   help="write the recipe to FILE (default: standard output)")
    s.set_defaults(func=_cmd_recipe, _cmd_parser=s)


def add_dequantize(sub):
    s = sub.add_parser("dequantize", help="the float reference of a quantized GGUF: every tensor as F32, exactly "
                                          "as its type decodes")
    s.add_argument("file", metavar="MODEL", help="a GGUF (any of the ggml types orkpy reads)")
    s.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="the F32 GGUF to write (the metadata copied, general.file_type 0); required")
    s.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    s.add_argument("-t", "--threads", type=_positive_int, default=None,
                   help="worker threads; never changes a result (default: all cores)")
    s.set_defaults(func=_cmd_dequantize)
