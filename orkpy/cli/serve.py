"""The serve command: an OpenAI-compatible HTTP server for one model (orkpy.server)."""
import argparse
import os
import sys

from ._common import UsageError, _positive_int, _weights_arg, weights_help

_SERVE_MODEL_HELP = "GGUF model or a quantized model folder; or -m/--model"


def _port(s):
    try:
        v = int(s)
    except ValueError:
        v = -1
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"must be an integer in 0 .. 65535, got {s}")
    return v


def _cmd_serve(args):
    from ..server import MISSING_EXTRA
    try:
        import uvicorn

        from ..server.app import create_app
    except ImportError as e:
        raise UsageError(f"{MISSING_EXTRA} ({e})") from None
    from ..runtime.model import load_model

    model = load_model(args.model, weights=_weights_arg(args.weights), threads=args.threads)
    app = create_app(model, alias=args.alias, n_ctx=args.ctx, threads=args.threads, api_key=args.api_key)
    eng = app.state.engine
    alias = args.alias or os.path.basename(str(model.path))  # create_app's default id
    print(f"orkpy serve: {model} as model id {alias!r}, context {eng.n_ctx} tokens per request; "
          f"http://{args.host}:{args.port}/v1 (Ctrl-C stops)", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def add_serve(sub):
    s = sub.add_parser("serve", help="an OpenAI-compatible HTTP server for one model (needs orkpy[serve])",
                       description="Serves /v1/models, /v1/completions and /v1/chat/completions (streaming as "
                                   "server-sent events) for one model, llama-server's and the OpenAI API's request "
                                   "fields where they apply (max_tokens, temperature, top_p, top_k, seed, stop); "
                                   "requests are queued and run one at a time. Needs the extra: "
                                   "pip install 'orkpy[serve]'. docs/server.md has the details.")
    s.add_argument("model", nargs="?", metavar="MODEL", help=_SERVE_MODEL_HELP)
    s.add_argument("-m", "--model", dest="model_opt", metavar="MODEL",
                   help="the model, as llama-server spells it (default: the positional MODEL)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    s.add_argument("--port", type=_port, default=8080, help="port to listen on (llama-server's default)")
    s.add_argument("-c", "--ctx-size", dest="ctx", type=_positive_int, default=None, metavar="N",
                   help="a request's context limit, prompt + generated tokens (default: the model's training "
                        "context, at most 4096)")
    s.add_argument("-a", "--alias", default=None, help="the model id /v1/models reports (default: the file name)")
    s.add_argument("--api-key", default=None, metavar="KEY",
                   help="require Authorization: Bearer KEY on every request but /health (default: none)")
    s.add_argument("-t", "--threads", type=_positive_int, default=None, metavar="N",
                   help="worker threads; never changes a result (default: all cores)")
    s.add_argument("--weights", default="gguf",
                   help=weights_help())
    s.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level")
    s.set_defaults(func=_cmd_serve, _slots=("model",), _slots_required=True)
