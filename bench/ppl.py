"""Forward-pass throughput (tokens/s of prefill) on the fp32, int8 and nf4
weight paths, measured in the same run:

  1. stories260K (the real model, ../shared/models/stories260K/stories260K-F32.gguf),
     chunks of n_ctx = 256 tokens;
  2. a synthetic model with Qwen3-1.7B's layer shapes (n_embd 2048, n_ff 6144,
     16 query / 8 KV heads of 128), --layers blocks, --tokens tokens per chunk.

    python bench/ppl.py [--layers 2] [--tokens 128] [--threads N]

Ratios are against the fp32 path of the same model.
"""
import argparse
import os

import numpy as np

import orkpy
from orkpy.evaluation.testing import best_time, synthetic_forward_model

SHARED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    caps = orkpy.capabilities()
    print(f"forward-pass throughput, kernels {caps['isa']}, threads {args.threads or caps['default_threads']}")
    print(f"{'model':<34}{'path':<6}{'tokens':>7}{'s/chunk':>10}{'tok/s':>10}{'x fp32':>8}")
    stories = os.path.join(SHARED, "models", "stories260K", "stories260K-F32.gguf")
    if os.path.exists(stories):
        toks = np.random.default_rng(0).integers(3, 512, 256).astype(np.int32)
        base = None
        for path in ("fp32", "int8", "nf4"):
            m = orkpy.load_model(stories, weights=path)
            t = best_time(lambda: m.forward(toks, first=128, threads=args.threads), args.repeat)
            base = base or t
            print(f"{'stories260K (n_ctx 256)':<34}{path:<6}{256:>7}{t:>10.4f}{256 / t:>10.0f}{base / t:>8.2f}")
    else:
        print(f"(stories260K not found under {SHARED}; skipped)")
    toks = np.random.default_rng(1).integers(0, 4096, args.tokens).astype(np.int32)
    base = None
    for path in ("fp32", "int8", "nf4"):
        m = synthetic_forward_model(n_layer=args.layers, path=path)
        t = best_time(lambda: m.forward(toks, args.tokens - 1, args.threads or 0), args.repeat)
        base = base or t
        name = f"Qwen3-1.7B shapes x{args.layers} layers"
        print(f"{name:<34}{path:<6}{args.tokens:>7}{t:>10.3f}{args.tokens / t:>10.1f}{base / t:>8.2f}")


if __name__ == "__main__":
    main()
