"""F32 perplexity throughput on the real models: orkpy against llama-perplexity on the same
chunks, n_ctx and threads, measured in the same run.

Both run the model's float reference: the exact dequantization of the shipped quantized GGUF
(SmolLM2-135M Q4_1, Gemma-3-270M Q4_K_M), written once as an F32 GGUF by
orkpy.convert.dequantize_gguf. Both score the same tokens: llama.cpp's own ids for the text
(tests/oracle.py oracle_tokens), cut into n_ctx chunks, the second half of each scored (the
head runs on those rows only, on both sides). Each measurement runs in a process of its own,
so its peak RSS is its own (the mapped model pages included, on both sides):

  llama     llama-perplexity -c CTX --chunks N -t T -tb T -b BATCH on the F32 file; tok/s is
            the tokens of its first pass (min(N, BATCH / CTX) chunks decoded together) over
            that pass's time, which it prints ("seconds per pass": the forward pass only; load,
            tokenization and scoring excluded). With the default -b 2048 it decodes 4 chunks
            as one batch of 2048 tokens; -b CTX decodes one chunk at a time, like orkpy
  orkpy     orkpy.load_model(F32 file) + orkpy.perplexity(model, ids, n_ctx, chunks, threads);
            tok/s = scored chunks x n_ctx / the perplexity call's wall time (forward passes and
            scoring; load and tokenization excluded); the tokenization of the text by orkpy's own
            tokenizer is timed apart

    python bench/real_ppl.py [--models smollm2 gemma3] [--chunks 4] [--threads 2] [--ctx 512]
                             [--repeat 2] [--text wikitext-2-raw-test.txt] [--llama-batch 2048]
                             [--quantized]

--repeat alternates the two sides that many times and keeps each side's best rate (the
machine may be shared). --quantized adds llama-perplexity on the shipped quantized file.
Needs the llama.cpp tools and the models of .ci/install (tests/oracle.py finds them).
"""
import argparse
import json
import os
import pathlib
import re
import resource
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED = pathlib.Path(os.environ.get("ORKPY_SHARED", ROOT.parent / "shared"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

import pytest  # noqa: E402  (tests/oracle.py reports a missing tool or model as a pytest skip)
from oracle import llama_bin, llama_perplexity, oracle_tokens, real_model  # noqa: E402
from workers import maxrss_mb, run_worker, serve_worker  # noqa: E402


def worker_llama(a):
    r = llama_perplexity(a["model"], a["text"], a["ctx"], a["chunks"], threads=a["threads"],
                         extra=["-b", str(a["batch"])])
    out = r["output"]
    n_seq = int(re.search(r"n_seq=(\d+)", out).group(1))
    t_pass = float(re.search(r"([0-9.]+) seconds per pass", out).group(1))
    return {"ppl": r["ppl"], "tok_s": min(n_seq, a["chunks"]) * a["ctx"] / t_pass, "n_seq": n_seq,
            "rss_mb": maxrss_mb(resource.RUSAGE_CHILDREN)}


def worker_orkpy(a):
    import numpy as np
    import orkpy
    t0 = time.perf_counter()
    m = orkpy.load_model(a["model"])
    load = time.perf_counter() - t0
    ids = np.fromfile(a["ids"], dtype=np.int32)
    r = orkpy.perplexity(m, ids, n_ctx=a["ctx"], chunks=a["chunks"], threads=a["threads"], progress=False)
    out = {"ppl": r.ppl, "tok_s": a["chunks"] * a["ctx"] / r.wall_time, "load_s": load,
           "rss_mb": maxrss_mb(resource.RUSAGE_SELF)}
    try:  # orkpy's own tokenizer on the same text (timed apart; ids compared with llama.cpp's)
        text = pathlib.Path(a["text"]).read_text(encoding="utf-8")
        t0 = time.perf_counter()
        own = m.tokens(text)
        out["tokenize_s"] = time.perf_counter() - t0
        out["ids_equal"] = bool(np.array_equal(own, ids))
    except Exception as e:  # noqa: BLE001  (an architecture or tokenizer not supported yet)
        out["tokenize_error"] = f"{type(e).__name__}: {e}"
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["smollm2", "gemma3"], choices=["smollm2", "gemma3"])
    ap.add_argument("--text", default=str(SHARED / "text" / "wikitext-2-raw-test.txt"))
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--llama-batch", type=int, default=2048, help="llama-perplexity -b (default: its own, 2048)")
    ap.add_argument("--quantized", action="store_true", help="also llama-perplexity on the shipped quantized file")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        serve_worker(a.worker, {"llama": worker_llama, "orkpy": worker_orkpy})
        return

    import orkpy
    from orkpy.convert import dequantize_gguf
    try:
        llama_bin("llama-perplexity")
        srcs = {name: real_model(name) for name in a.models}
    except pytest.skip.Exception as e:
        sys.exit(f"real_ppl: {e.msg}")
    caps = orkpy.capabilities()
    print(f"F32 perplexity throughput: n_ctx {a.ctx}, {a.chunks} chunks of {pathlib.Path(a.text).name}, "
          f"{a.threads} threads, orkpy kernels {caps['isa']}, best of {a.repeat} (sides alternated)")
    print("both sides run the exact F32 dequantization of the shipped quantized file, on llama.cpp's token ids")
    print(f"{'model':<14}{'side':<18}{'tok/s':>9}{'peak RSS MB':>13}{'PPL':>12}   notes")
    with tempfile.TemporaryDirectory(prefix="orkpy-real-ppl-") as work:
        for name in a.models:
            f32 = pathlib.Path(work) / f"{name}-F32.gguf"
            t0 = time.perf_counter()
            dequantize_gguf(srcs[name], f32)
            t_deq = time.perf_counter() - t0
            ids = oracle_tokens(f32, a.text)
            ids_path = pathlib.Path(work) / f"{name}.ids"
            ids.tofile(ids_path)
            job = {"model": str(f32), "text": a.text, "ids": str(ids_path), "ctx": a.ctx, "chunks": a.chunks,
                   "threads": a.threads, "batch": a.llama_batch}
            best = {}
            for _ in range(a.repeat):
                for side in ("llama", "orkpy"):
                    r = run_worker(__file__, side, job)
                    if side not in best or r["tok_s"] > best[side]["tok_s"]:
                        best[side] = r
            if a.quantized:
                best["llama-quantized"] = run_worker(__file__, "llama", dict(job, model=str(srcs[name])))
            o, ll = best["orkpy"], best["llama"]
            for side, r in best.items():
                note = ""
                if side == "orkpy":
                    note = f"load {o['load_s']:.2f} s; "
                    if "tokenize_s" in o:
                        note += (f"own tokenizer {o['tokenize_s']:.1f} s for the whole text, ids "
                                 f"{'identical to' if o['ids_equal'] else 'DIFFERENT from'} llama.cpp's")
                    else:
                        note += f"own tokenizer: {o['tokenize_error']}"
                elif side == "llama":
                    note = f"-b {a.llama_batch}: {min(r['n_seq'], a.chunks)} chunks per pass; F32 file written in {t_deq:.1f} s"
                else:
                    note = pathlib.Path(srcs[name]).name
                print(f"{name:<14}{side:<18}{r['tok_s']:>9.1f}{r['rss_mb']:>13.0f}{r['ppl']:>12.4f}   {note}")
            print(f"{name:<14}{'orkpy / llama':<18}{o['tok_s'] / ll['tok_s']:>9.2f}{o['rss_mb'] / ll['rss_mb']:>13.2f}"
                  f"{o['ppl'] / ll['ppl'] - 1:>+12.2e}   (ratios; PPL as a relative difference)")


if __name__ == "__main__":
    main()
