"""Seeds for fuzz_o4n1: O4N1/O8N1 files written by orkpy.save_packed for a few
shapes and every kind (generated at run time; the small stored corpus is
tests/fuzz/corpus/o4n1/).

    python3 tests/fuzz/seeds_o4n1.py OUTDIR
"""
import pathlib
import sys
import tempfile

# (N, K): 1 x 1, odd sizes (padding in both tile dimensions), several tiles,
# and zero rows (scale 0); (N, K, group): group-wise scales (version 3, float16)
SHAPES = [(1, 1), (3, 5), (33, 40), (64, 64), (2, 100)]
GROUPED = [(3, 100, 32), (33, 70, 64)]


def files():
    """{name: bytes} of save_packed outputs."""
    import numpy as np
    import orkpy

    out = {}
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as d:
        for N, K in SHAPES:
            w = rng.standard_normal((N, K)).astype(np.float32)
            if N > 2:
                w[1] = 0.0
            for kind in ("nf4", "int4", "int8"):
                p = pathlib.Path(d) / f"{kind}-{N}x{K}"
                orkpy.save_packed(orkpy.pack(orkpy.quantize(w, kind)), p)
                out[p.name] = p.read_bytes()
        for N, K, g in GROUPED:
            w = rng.standard_normal((N, K)).astype(np.float32)
            w[1, :g] = 0.0
            for kind in ("nf4", "int8"):
                p = pathlib.Path(d) / f"{kind}-{N}x{K}-g{g}"
                orkpy.save_packed(orkpy.pack(orkpy.quantize(w, kind, group_size=g)), p)
                out[p.name] = p.read_bytes()
    return out


def write_corpus(out):
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in files().items():
        p = out / f"seed-{name}"
        p.write_bytes(data)
        written.append(p)
    return written


if __name__ == "__main__":
    print(len(write_corpus(sys.argv[1])), "seeds")
