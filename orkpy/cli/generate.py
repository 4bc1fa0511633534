"""The generate command: a prompt's continuation, streamed."""
import argparse
import sys

from ._common import UsageError, _count, _positive_int, _weights_arg, read_text_like_llama_cpp, weights_help
# generate takes no --meta: a GGUF or a model folder carries its own hyper-parameters and tokenizer
_GENERATE_MODEL_HELP = "GGUF model or a quantized model folder; or -m/--model"


def _cmd_generate(args):
    from ..runtime.generate import generate
    from ..runtime.model import load_model

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


def add_generate(sub):
    from ..kernels.quant import FOUR_BIT_KINDS  # the int4 tier's codebooks, from the C kind registry

    s = sub.add_parser("generate", help="generate text from a prompt (KV-cached decode), streamed to stdout",
                       description="The continuation of a prompt, written to stdout as it comes (orkpy.runtime.generate: "
                                   "llama.cpp's top-k -> top-p -> temperature order, numpy's default_rng(seed)); "
                                   "timings on stderr. Stops at -n tokens or an end-of-generation token.")
    s.add_argument("model", nargs="?", metavar="MODEL", help=_GENERATE_MODEL_HELP)
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
                   help=weights_help())
    s.add_argument("--int4-kind", choices=FOUR_BIT_KINDS, default="nf4",
                   help="codebook of the int4-tier linears when --weights is a map or an allocation")
    s.set_defaults(func=_cmd_generate, _slots=("model",), _slots_required=True)
