"""orkpy's command line: orkpy COMMAND ... or python -m orkpy COMMAND.

The model-running commands also take llama-perplexity / llama-imatrix
spellings: -m/--model, -f/--file, -c/--ctx-size, -t/--threads, --chunks,
-b/--batch-size, --kl-divergence-base / --kl-divergence.
"""
import sys

from .. import __version__
from .._core import NPUError, UnavailableError
from . import evaluate, generate, inspect, quantize, serve
from ._common import (EPILOG, _RUNTIME_ERRORS, UsageError, _check_output_path, _fill_slots,  # noqa: F401
                      _Parser, read_text_like_llama_cpp)
# the command functions, here too: main() runs orkpy.cli._cmd_<name> (tests replace one)
from .evaluate import _cmd_ffn_sweep, _cmd_gate, _cmd_ppl  # noqa: F401
from .generate import _cmd_generate  # noqa: F401
from .inspect import _cmd_gguf_info, _cmd_info, _cmd_npu_dump, _cmd_npu_plan, _cmd_quant_report, _cmd_tier_map  # noqa: F401
from .quantize import _cmd_dequantize, _cmd_imatrix, _cmd_quantize, _cmd_recipe  # noqa: F401
from .serve import _cmd_serve  # noqa: F401

# every subcommand, in the order `orkpy --help` lists them: (name, the function that adds its parser)
SUBCOMMANDS = (
    ("generate", generate.add_generate),
    ("serve", serve.add_serve),
    ("info", inspect.add_info),
    ("quant-report", inspect.add_quant_report),
    ("ppl", evaluate.add_ppl),
    ("imatrix", quantize.add_imatrix),
    ("quantize", quantize.add_quantize),
    ("recipe", quantize.add_recipe),
    ("ffn-sweep", evaluate.add_ffn_sweep),
    ("dequantize", quantize.add_dequantize),
    ("npu-dump", inspect.add_npu_dump),
    ("npu-plan", inspect.add_npu_plan),
    ("gate", evaluate.add_gate),
    ("gguf-info", inspect.add_gguf_info),
    ("tier-map", inspect.add_tier_map),
)


def build_parser():
    p = _Parser(prog="orkpy", description=__doc__)
    p.add_argument("--version", action="version", version=f"orkpy {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for _name, add in SUBCOMMANDS:
        add(sub)
    return p


def main(argv=None):
    """Run one command; returns the exit status (see EPILOG). argparse's own usage errors exit 2 through
    SystemExit; TypeError, KeyError and the like are bugs and keep their traceback."""
    who = "orkpy"
    try:
        args = build_parser().parse_args(argv)
        args._argv = list(sys.argv[1:] if argv is None else argv)  # which options were given (orkpy recipe)
        who = f"orkpy {args.command}"
        _fill_slots(args)
        func = getattr(sys.modules[__name__], args.func.__name__, args.func)  # orkpy.cli's, if replaced
        return func(args)
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
