"""The fused int8 SwiGLU chain sweep on stories260K: PPL and mean KL vs F32
for the per-op baseline, fused-all, each ablation, clip percentiles
99.9/99.5/99, asymmetric zero point, per-channel output, unfused, and the
sprinkle with 0..all layers exact (ordered by gmax) plus the automatic
selection. All linears are int8 (w8a8); the prep pass and the evaluation use
tinystories-val-B at n_ctx 256.

    python bench/ffn_sweep.py [--chunks 200] [--calib-chunks 200] [--json-out OUT]
"""
import argparse
import os
import sys

from orkpy.cli import main as cli_main

SHARED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunks", type=int, default=200)
    ap.add_argument("--calib-chunks", type=int, default=200)
    ap.add_argument("--json-out", metavar="FILE", help="also write the JSON rows (JSON lines) to FILE")
    args = ap.parse_args()
    model = os.path.join(SHARED, "models", "stories260K", "stories260K-F32.gguf")
    text = os.path.join(SHARED, "text", "tinystories-val-B.txt")
    argv = ["ffn-sweep", model, text, "--calib", text, "--chunks", str(args.chunks), "--calib-chunks",
            str(args.calib_chunks)] + (["--json-out", args.json_out] if args.json_out else [])
    sys.exit(cli_main(argv))


if __name__ == "__main__":
    main()
