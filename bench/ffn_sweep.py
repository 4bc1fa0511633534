"""The fused int8 SwiGLU chain sweep on stories260K: PPL and mean KL vs F32
for the per-op baseline, fused-all, each ablation, clip percentiles
99.9/99.5/99, asymmetric zero point, per-channel output, unfused, and the
sprinkle with 0..all layers exact (ordered by gmax) plus the automatic
selection, and the sprinkle chosen by sensitivity (exact SiLU, and un-fused)
next to the gmax sprinkle with as many exact layers. All linears are int8
(w8a8); the evaluation scores tinystories-val-B at n_ctx 256, the prep pass and
the sensitivity search calibrate on wikitext-2 (never the scored text).

    python bench/ffn_sweep.py [--chunks 200] [--calib-chunks 200] [--sens-chunks 8]
                              [--sens-method lazy] [--sens-budget N|KL] [--json-out OUT]
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
    ap.add_argument("--sens-chunks", type=int, default=None, help="calibration chunks of the sensitivity search")
    ap.add_argument("--sens-method", default="lazy", choices=("lazy", "greedy", "single"))
    ap.add_argument("--sens-budget", default=None, metavar="N|KL", help="exact layers or a KL target (default: 25%%)")
    ap.add_argument("--json-out", metavar="FILE", help="also write the JSON rows (JSON lines) to FILE")
    args = ap.parse_args()
    model = os.path.join(SHARED, "models", "stories260K", "stories260K-F32.gguf")
    text = os.path.join(SHARED, "text", "tinystories-val-B.txt")
    calib = os.path.join(SHARED, "text", "wikitext-2-raw-test.txt")
    argv = ["ffn-sweep", model, text, "--calib", calib, "--chunks", str(args.chunks), "--calib-chunks",
            str(args.calib_chunks), "--sens-method", args.sens_method]
    argv += ["--sens-chunks", str(args.sens_chunks)] if args.sens_chunks else []
    argv += ["--sens-budget", args.sens_budget] if args.sens_budget else []
    argv += ["--json-out", args.json_out] if args.json_out else []
    sys.exit(cli_main(argv))


if __name__ == "__main__":
    main()
