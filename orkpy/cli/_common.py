"""What every orkpy subcommand shares: the exit status rule, the help formatter and parser class, the
llama.cpp spellings (-m/-f/-c/-t/-b), the transform and activation flags, output-path checks, --meta,
--weights and the argument types."""
import argparse
import os
import sys
import textwrap

from .._core import NPUError, UnavailableError
from .._io import read_text_like_llama_cpp  # noqa: F401 -- also orkpy.cli.read_text_like_llama_cpp, as before

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


def _add_transform_args(s, *, calib=True, ctx_option="--ctx"):
    """--rotate / --rotate-online / --smooth (orkpy.runtime.rotate) and, with ``calib``, --calib /
    --calib-chunks: the calibration text they and the static activation ranges need, in chunks of
    ``ctx_option`` tokens."""
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
                       help=f"calibration chunks of {ctx_option} tokens (default: 8)")


def _add_act_args(s):
    from ..kernels.actspec import ACT_MODES
    s.add_argument("--act", choices=ACT_MODES, default=None,
                   help="activation mode of the packed linears: one int8 scale per token (dynamic), per forward "
                        "call, static calibrated ranges (the NPU can chain them), or per token with outlier "
                        "channels in float (default: the one a model directory's recipe was made for, else "
                        "per_token)")
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
    from ..formats.source import is_safetensors

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


def _weights_arg(spec):
    """--weights: a path name, an emit-map file, or a GGUF whose types allocate the tiers."""
    from ..runtime.model import PATHS
    from ..formats.source import read_allocation
    if spec in PATHS:
        return spec
    if not os.path.exists(spec):
        raise UsageError(f"--weights {spec!r}: not a weight path (one of {', '.join(PATHS)}) and no such file (an "
                         "emit-map or an allocation GGUF)")
    return read_allocation(spec).tiers


_PACKED_WEIGHTS = "int8, nf4, int4, an emit-map file or an allocation GGUF with int8/int4 tiers"


def weights_help():
    """--weights' help: every weight path orkpy.runtime.model.PATHS names, then the files it takes."""
    from ..runtime.model import PATHS
    return (f"a weight path for every linear ({'|'.join(PATHS)}), an emit-map file, or a mixed GGUF used as "
            "allocation oracle")


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


_even_ctx = _int_arg(4, "an even integer >= 4 (the second half of a chunk is scored)", even=True)
_ctx_size = _int_arg(2, "an integer >= 2")


def _threshold(s):
    v = float(s)
    if not 0.0 < v < 64.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 64) bits per weight, got {s}")
    return v


_MODEL_HELP = "GGUF model, a safetensors checkpoint (with --meta) or a quantized model folder; or -m/--model"
_TEXT_HELP = "UTF-8 text file, one trailing newline dropped as llama-perplexity -f does; or -f/--file"
