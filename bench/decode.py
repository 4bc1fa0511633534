"""Decode throughput (tokens/s, one token per step through the KV cache): orkpy's session
against llama.cpp's llama-bench on the same model, weights and threads, measured in one run.

The model is SmolLM2-135M's float reference: the exact F32 dequantization of the shipped Q4_1
file (orkpy.formats.convert.dequantize_gguf), and llama-quantize's Q8_0 and Q4_0 of that F32 file. Rows:

  F32           orkpy load_model(F32, weights="gguf")   vs  llama-bench on the F32 file
  int8 / Q8_0   orkpy load_model(F32, weights="int8")   vs  llama-bench on the Q8_0 file   (w8a8)
  nf4 / Q4_0    orkpy load_model(F32, weights="nf4")    vs  llama-bench on the Q4_0 file   (i4a8)

  llama     llama-bench -p 0 -n N -t T -r R -o json (its tg test: N single-token decodes from an
            empty cache, random tokens, after a warm-up; its own F16 KV cache): avg +- sd of
            tokens/s over the R repetitions. Without llama-bench, ork-oracle greedy (tests/oracle.py
            oracle_greedy: BOS then N greedy tokens, float32 cache): one repetition.
  orkpy     the same shape: Model.session(N), then N evals of one token (BOS, then random ids),
            threads T, after a warm-up run; avg +- sd over R fresh sessions. Only the evals are
            timed (no sampling), as llama-bench times only llama_decode.

Each side runs in a fresh process of its own, so its peak RSS column is its own (the mapped
model file's pages included on both sides; orkpy's int8 / nf4 rows also touched the F32 file while
quantizing it). Run it on a quiet machine: llama.cpp's threads spin on a barrier after every op, so
when another process holds a core, -t 2 collapses (measured here: Q8_0 5 tok/s at -t 2 against 80 at
-t 1 on a half-busy 2-core machine); --threads 1 is the fair row under load.

    nice -n 10 python bench/decode.py [--threads 2] [--n 64] [--repeat 3] [--rows f32 int8 nf4] [--json]

Needs the llama.cpp tools and SmolLM2 of .ci/install (tests/oracle.py finds them).
"""
import argparse
import json
import os
import pathlib
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

import pytest  # noqa: E402  (tests/oracle.py reports a missing tool or model as a pytest skip)
from oracle import BIN, llama_bin, llama_quantize, oracle_greedy, real_model  # noqa: E402
from workers import maxrss_mb, run_worker, serve_worker  # noqa: E402

ROWS = {"f32": ("F32", "gguf", None), "int8": ("int8 / Q8_0", "int8", "Q8_0"), "nf4": ("nf4 / Q4_0", "nf4", "Q4_0")}


def worker_orkpy(a):
    import numpy as np
    import orkpy
    t0 = time.perf_counter()
    m = orkpy.load_model(a["model"], weights=a["weights"])
    load = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    bos = m.tokenizer.bos_id if m.tokenizer.bos_id is not None else 0
    rates = []
    for rep in range(a["repeat"] + 1):  # the first run warms up
        toks = [bos] + rng.integers(0, m.n_vocab, a["n"] - 1).tolist()
        s = m.session(a["n"])
        dt = 0.0
        for t in toks:
            t1 = time.perf_counter()
            s.eval([t], threads=a["threads"])
            dt += time.perf_counter() - t1
        if rep:
            rates.append(a["n"] / dt)
    return {"tok_s": statistics.mean(rates), "sd": statistics.stdev(rates) if len(rates) > 1 else 0.0,
            "load_s": load, "rss_mb": maxrss_mb(resource.RUSAGE_SELF)}


def worker_llama(a):
    bench = BIN / "llama-bench"
    if bench.is_file() and os.access(bench, os.X_OK):
        out = subprocess.run([str(bench), "-m", a["model"], "-p", "0", "-n", str(a["n"]), "-t", str(a["threads"]),
                              "-r", str(a["repeat"]), "-o", "json"], capture_output=True, text=True, check=True).stdout
        r = json.loads(out[out.index("["):])[0]
        return {"tok_s": float(r["avg_ts"]), "sd": float(r["stddev_ts"]), "how": "llama-bench",
                "rss_mb": maxrss_mb(resource.RUSAGE_CHILDREN)}
    import numpy as np
    tm = {}
    oracle_greedy(a["model"], np.array([a["bos"]], np.int32), a["n"], threads=a["threads"], timing=tm)
    return {"tok_s": tm["decode_tokens"] / (tm["decode_ms"] / 1e3), "sd": 0.0, "how": "ork-oracle greedy",
            "rss_mb": maxrss_mb(resource.RUSAGE_CHILDREN)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n", type=int, default=64, help="tokens decoded per run (llama-bench -n)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per side (llama-bench -r)")
    ap.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    ap.add_argument("--json", action="store_true", help="also print the results as JSON")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        serve_worker(a.worker, {"llama": worker_llama, "orkpy": worker_orkpy})
        return

    import orkpy
    from orkpy.formats.convert import dequantize_gguf
    try:
        llama_bin("llama-quantize")
        src = real_model("smollm2")
    except pytest.skip.Exception as e:
        sys.exit(f"decode: {e.msg}")
    caps = orkpy.capabilities()
    print(f"decode throughput, SmolLM2-135M float reference: {a.n} single-token steps from an empty cache, "
          f"{a.threads} threads, orkpy kernels {caps['isa']}, avg +- sd of {a.repeat} runs; "
          f"load average {os.getloadavg()[0]:.2f} at the start")
    print(f"{'row':<14}{'side':<8}{'tok/s':>16}{'peak RSS MB':>13}   notes")
    results = {}
    with tempfile.TemporaryDirectory(prefix="orkpy-decode-") as work:
        f32 = pathlib.Path(work) / "smollm2-F32.gguf"
        dequantize_gguf(src, f32)
        bos = orkpy.Tokenizer.from_gguf(f32).bos_id
        for key in a.rows:
            label, weights, qtype = ROWS[key]
            lfile = f32 if qtype is None else llama_quantize(f32, pathlib.Path(work) / f"smollm2-{qtype}.gguf",
                                                             qtype, threads=a.threads)
            job = {"n": a.n, "threads": a.threads, "repeat": a.repeat, "bos": bos}
            r = {"llama": run_worker(__file__, "llama", dict(job, model=str(lfile))),
                 "orkpy": run_worker(__file__, "orkpy", dict(job, model=str(f32), weights=weights))}
            results[key] = r
            for side, x in r.items():
                note = x.get("how", "") + (f" on {lfile.name}" if side == "llama" else
                                           f"weights={weights!r}, load {x['load_s']:.1f} s")
                print(f"{label:<14}{side:<8}{x['tok_s']:>9.1f} +-{x['sd']:>5.1f}{x['rss_mb']:>13.0f}   {note}")
            o, ll = r["orkpy"], r["llama"]
            print(f"{label:<14}{'ratio':<8}{o['tok_s'] / ll['tok_s']:>9.2f}{'':>7}{o['rss_mb'] / ll['rss_mb']:>13.2f}"
                  f"   orkpy / llama.cpp")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    if a.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
