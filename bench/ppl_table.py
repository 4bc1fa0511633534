"""The product's PPL table on stories260K (../shared/models/stories260K/, text
../shared/text/tinystories-val-B.txt, n_ctx 256): PPL, delta and mean KL vs
F32, and the int8 share of weight storage, for F32; llama.cpp Q8_0 and Q4_K_M
(GGUF-native); all-int8 w8a8; ours (fp16 + allocation + imatrix + NF4); ours
without imatrix; ours with SR; uniform int4; double-quant -- with both
allocation files (Q4_0: a genuinely mixed allocation; Q4_K_M: this tiny model's
K-quants fall back to 5/8-bit types, so everything is int8 at threshold 5).

    python bench/ppl_table.py [--chunks N] [--json OUT]

The imatrix is collected by orkpy on the same text (as llama.cpp's
stories260K-imatrix-B.dat was).
"""
import argparse
import json
import os
import sys
import time

import orkpy  # noqa: F401
from orkpy.cli import read_text_like_llama_cpp
from orkpy.evaluation.table import format_table, ppl_table

SHARED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunks", type=int, default=None)
    ap.add_argument("--json", help="also write the rows as JSON")
    args = ap.parse_args()
    text = read_text_like_llama_cpp(os.path.join(SHARED, "text", "tinystories-val-B.txt"))
    t0 = time.perf_counter()
    rows = ppl_table(os.path.join(SHARED, "models", "stories260K"), text, chunks=args.chunks,
                     log=lambda m: print(m, file=sys.stderr))
    print(f"stories260K, n_ctx 256, {args.chunks or 'all'} chunks of tinystories-val-B ({time.perf_counter() - t0:.0f} s)")
    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.as_dict() for r in rows], f, indent=1)


if __name__ == "__main__":
    main()
