"""Perplexity throughput (the forward pass) of orkpy against llama-perplexity on the same model,
chunks, n_ctx and threads, measured in the same run: F32 against F32, int8 (w8a8) against Q8_0,
NF4 (i4a8) against Q4_0.

Models (--models):

  smollm2, gemma3   the float reference of the shipped quantized GGUF (SmolLM2-135M Q4_1,
                    Gemma-3-270M Q4_K_M): its exact dequantization, written once as an F32 GGUF by
                    orkpy.formats.convert.dequantize_gguf
  qwen3             a random-weight model of the Qwen3-1.7B widths (hidden 2048, FFN 6144, 16 / 8
                    heads of 128, per-head q/k norms, tied embedding, a 2048-token byte-level
                    vocabulary) and --qwen3-layers blocks (default 2), written as F16 by
                    bench/quant_model.py's make_model, then dequantized to F32 the same way. Its
                    weights and vocabulary are random: its PPL is meaningless, only the tok/s and
                    the RSS are figures

Rows (--rows), each a pair of processes on the same F32 source:

  f32    orkpy load_model(F32, weights="gguf")   vs  llama-perplexity on the F32 file
  int8   orkpy load_model(F32, weights="int8")   vs  llama-perplexity on llama-quantize's Q8_0 of it
  nf4    orkpy load_model(F32, weights="nf4")    vs  llama-perplexity on llama-quantize's Q4_0 of it

The built files (F32, Q8_0, Q4_0, the qwen3 F16) are kept under --work (default
/tmp/orkpy-real-ppl, never the repository), so a second run reuses them. Both sides score the
same tokens: llama.cpp's own ids for the text (tests/oracle.py oracle_tokens), cut into n_ctx
chunks, the second half of each scored (the head runs on those rows only, on both sides). Each
measurement runs in a process of its own, so its peak RSS is its own (the mapped model pages
included, on both sides; orkpy's int8 / nf4 rows also touched the F32 file while quantizing it):

  llama     llama-perplexity -c CTX --chunks N -t T -tb T -b BATCH on the row's file; tok/s is
            the tokens of its first pass (min(N, BATCH / CTX) chunks decoded together) over
            that pass's time, which it prints ("seconds per pass": the forward pass only; load,
            tokenization and scoring excluded). With the default -b 2048 it decodes 4 chunks
            as one batch of 2048 tokens; -b CTX decodes one chunk at a time, like orkpy.
            --llama-repack auto (default) keeps llama.cpp's weight repacking and extra buffer
            types, unless the run dies on SIGILL: then -nr (seen on an x86 VM whose CPU advertises
            AMX: llama.cpp's AMX Q8_0 / Q4_0 kernels fault on tilezero), printed in the notes
  orkpy     orkpy.load_model(F32 file, weights=W) + orkpy.perplexity(model, ids, n_ctx, chunks,
            threads); tok/s = scored chunks x n_ctx / the perplexity call's wall time (forward
            passes and scoring; load, i.e. the quantization of the int8 / nf4 rows, and
            tokenization excluded; the load time is printed). In the f32 row, the tokenization of
            the text by orkpy's own tokenizer is timed apart

    python bench/real_ppl.py [--models smollm2 gemma3 qwen3] [--rows f32 int8 nf4] [--chunks 4]
                             [--threads 2] [--ctx 512] [--repeat 2] [--qwen3-layers 2]
                             [--text wikitext-2-raw-test.txt] [--llama-batch 2048] [--work DIR]
                             [--llama-repack auto|on|off] [--quantized]

--repeat alternates the two sides of a row that many times and keeps each side's best rate (the
machine may be shared). --quantized adds llama-perplexity on the shipped quantized file (smollm2,
gemma3). Needs the llama.cpp tools and the models of .ci/install (tests/oracle.py finds them).
That cached llama.cpp is a portable AVX2 build (.ci/llama-oracle); to compare against a
-march=native build (AVX-512 where the CPU has it) point ORKPY_LLAMA_BIN at its bin directory.
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
from oracle import BIN, llama_bin, llama_perplexity, llama_quantize, oracle_tokens, real_model  # noqa: E402
from workers import maxrss_mb, run_worker, serve_worker  # noqa: E402


def worker_llama(a):
    repack = a.get("repack", "auto")

    def run(on):
        return llama_perplexity(a["model"], a["text"], a["ctx"], a["chunks"], threads=a["threads"],
                                extra=["-b", str(a["batch"]), *([] if on else ["-nr"])])
    try:
        r = run(repack != "off")
    except RuntimeError as e:  # SIGILL: llama.cpp's AMX kernels (an extra buffer type) on a VM without AMX state
        if repack != "auto" or "failed (-4)" not in str(e):
            raise
        repack = "off"
        r = run(False)
    out = r["output"]
    n_seq = int(re.search(r"n_seq=(\d+)", out).group(1))
    t_pass = float(re.search(r"([0-9.]+) seconds per pass", out).group(1))
    return {"ppl": r["ppl"], "tok_s": min(n_seq, a["chunks"]) * a["ctx"] / t_pass, "n_seq": n_seq,
            "repack": repack != "off", "rss_mb": maxrss_mb(resource.RUSAGE_CHILDREN)}


def worker_orkpy(a):
    import numpy as np
    import orkpy
    t0 = time.perf_counter()
    m = orkpy.load_model(a["model"], weights=a.get("weights", "gguf"))
    load = time.perf_counter() - t0
    ids = np.fromfile(a["ids"], dtype=np.int32)
    r = orkpy.perplexity(m, ids, n_ctx=a["ctx"], chunks=a["chunks"], threads=a["threads"], progress=False)
    out = {"ppl": r.ppl, "tok_s": a["chunks"] * a["ctx"] / r.wall_time, "load_s": load,
           "rss_mb": maxrss_mb(resource.RUSAGE_SELF)}
    if not a.get("tokenizer", True):
        return out
    try:  # orkpy's own tokenizer on the same text (timed apart; ids compared with llama.cpp's)
        text = pathlib.Path(a["text"]).read_text(encoding="utf-8")
        t0 = time.perf_counter()
        own = m.tokens(text)
        out["tokenize_s"] = time.perf_counter() - t0
        out["ids_equal"] = bool(np.array_equal(own, ids))
    except Exception as e:  # noqa: BLE001  (an architecture or tokenizer not supported yet)
        out["tokenize_error"] = f"{type(e).__name__}: {e}"
    return out


#: row: (label, orkpy weights=, llama-quantize type of the F32 file or None for the F32 file itself)
ROWS = {"f32": ("F32", "gguf", None), "int8": ("int8 / Q8_0", "int8", "Q8_0"), "nf4": ("nf4 / Q4_0", "nf4", "Q4_0")}
#: Qwen3-1.7B widths (bench/quant_model.py SHAPES["1.7B"]: hidden, FFN, layers, heads, KV heads)
QWEN3 = "1.7B"


def built(path, make):
    """``path``, made by ``make(tmp)`` into a temporary name and renamed when absent (a second run reuses it,
    an interrupted one leaves no half file); returns (path, seconds spent, 0.0 when reused)."""
    path = pathlib.Path(path)
    if path.exists():
        return path, 0.0
    tmp = path.with_name(path.name + ".part")
    t0 = time.perf_counter()
    make(tmp)
    os.replace(tmp, path)
    return path, time.perf_counter() - t0


def source_f32(name, work, a, srcs):
    """(F32 GGUF, seconds spent writing it or 0.0 when reused, description) of model ``name`` under ``work``."""
    from orkpy.formats.convert import dequantize_gguf
    if name != "qwen3":
        f32, t = built(work / f"{name}-F32.gguf", lambda tmp: dequantize_gguf(srcs[name], tmp))
        return f32, t, f"exact F32 dequantization of {srcs[name].name}"
    import quant_model as qm
    D, F, _, H, KV = qm.SHAPES[QWEN3]
    shape = f"{QWEN3}-L{a.qwen3_layers}"
    qm.SHAPES[shape] = (D, F, a.qwen3_layers, H, KV)  # make_model writes shapes by name
    t0 = time.perf_counter()
    f16, _ = qm.make_model(work, shape)
    t16 = time.perf_counter() - t0
    f32, t = built(work / f"qwen3-{shape}-shape-F32.gguf", lambda tmp: dequantize_gguf(f16, tmp))
    return f32, (t + t16 if t else 0.0), (f"random weights, Qwen3-{QWEN3} widths (hidden {D}, FFN {F}, {H}/{KV} heads "
                                         f"of {qm.HEAD_DIM}), {a.qwen3_layers} blocks, vocab {qm.VOCAB}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["smollm2", "gemma3"], choices=["smollm2", "gemma3", "qwen3"])
    ap.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    ap.add_argument("--qwen3-layers", type=int, default=2, help="blocks of the qwen3 model (default 2)")
    ap.add_argument("--text", default=str(SHARED / "text" / "wikitext-2-raw-test.txt"))
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--llama-batch", type=int, default=2048, help="llama-perplexity -b (default: its own, 2048)")
    ap.add_argument("--llama-repack", default="auto", choices=["auto", "on", "off"],
                    help="llama.cpp's weight repacking / extra buffer types (AMX): off = -nr; auto: on, "
                         "and -nr when llama-perplexity dies on SIGILL (AMX in a VM that does not keep its state)")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "orkpy-real-ppl"),
                    help="where the built model files are kept and reused")
    ap.add_argument("--quantized", action="store_true", help="also llama-perplexity on the shipped quantized file")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        serve_worker(a.worker, {"llama": worker_llama, "orkpy": worker_orkpy})
        return

    import orkpy
    try:
        llama_bin("llama-perplexity")
        if any(ROWS[r][2] for r in a.rows):
            llama_bin("llama-quantize")
        srcs = {name: real_model(name) for name in a.models if name != "qwen3"}
    except pytest.skip.Exception as e:
        sys.exit(f"real_ppl: {e.msg}")
    work = pathlib.Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    caps = orkpy.capabilities()
    print(f"perplexity throughput (forward pass): n_ctx {a.ctx}, {a.chunks} chunks of {pathlib.Path(a.text).name}, "
          f"{a.threads} threads, orkpy kernels {caps['isa']} (matmul {caps['matmul_kernels']}), best of {a.repeat} "
          f"(sides alternated); "
          f"load average {os.getloadavg()[0]:.2f} at the start")
    print("rows: F32 = both sides on the F32 file; int8 / Q8_0 = orkpy w8a8 (quantized at load, load excluded) vs "
          "llama-quantize Q8_0 of it; nf4 / Q4_0 = orkpy i4a8 vs Q4_0; all on llama.cpp's token ids")
    print(f"llama.cpp tools: {BIN}" + (" (ORKPY_LLAMA_BIN)" if os.environ.get("ORKPY_LLAMA_BIN") else
                                        " (the tests' portable AVX2 build)"))
    if "qwen3" in a.models:
        print("qwen3: random weights and vocabulary, its PPL is meaningless: only tok/s and RSS are figures")
    print(f"{'model':<10}{'row':<13}{'side':<16}{'tok/s':>9}{'peak RSS MB':>13}{'PPL':>12}   notes")
    for name in a.models:
        f32, t_f32, what = source_f32(name, work, a, srcs)
        print(f"{name:<10}{what}; F32 file {f32.stat().st_size / 1e6:.0f} MB, "
              + (f"written in {t_f32:.1f} s" if t_f32 else f"reused from {work}"), flush=True)
        ids = oracle_tokens(f32, a.text)
        ids_path = work / f"{name}.ids"
        ids.tofile(ids_path)
        job = {"text": a.text, "ids": str(ids_path), "ctx": a.ctx, "chunks": a.chunks, "threads": a.threads,
               "batch": a.llama_batch, "repack": a.llama_repack}
        for row in a.rows:
            label, weights, qtype = ROWS[row]
            lfile, t_q = (f32, 0.0) if qtype is None else built(
                f32.with_name(f32.name.replace("-F32.gguf", f"-{qtype}.gguf")),
                lambda tmp, qtype=qtype: llama_quantize(f32, tmp, qtype, threads=a.threads))
            jobs = {"llama": dict(job, model=str(lfile)),
                    "orkpy": dict(job, model=str(f32), weights=weights, tokenizer=row == "f32")}
            best = {}
            for _ in range(a.repeat):
                for side in ("llama", "orkpy"):
                    r = run_worker(__file__, side, jobs[side])
                    if side == "llama":  # an "auto" fallback to -nr holds for the row's later runs
                        jobs[side]["repack"] = "on" if r["repack"] else "off"
                    if side not in best or r["tok_s"] > best[side]["tok_s"]:
                        best[side] = r
            if a.quantized and row == "f32" and name in srcs:
                best["llama-quantized"] = run_worker(__file__, "llama", dict(job, model=str(srcs[name])))
            o, ll = best["orkpy"], best["llama"]
            for side, r in best.items():
                if side == "orkpy":
                    note = f"weights={weights!r}, load {o['load_s']:.2f} s (excluded)"
                    if "tokenize_s" in o:
                        note += (f"; own tokenizer {o['tokenize_s']:.1f} s for the whole text, ids "
                                 f"{'identical to' if o['ids_equal'] else 'DIFFERENT from'} llama.cpp's")
                    elif "tokenize_error" in o:
                        note += f"; own tokenizer: {o['tokenize_error']}"
                elif side == "llama":
                    note = (f"{lfile.name}, -b {a.llama_batch}{'' if r['repack'] else ' -nr'}: "
                            f"{min(r['n_seq'], a.chunks)} chunks per pass")
                    if not r["repack"] and a.llama_repack == "auto":
                        note += " (-nr: SIGILL in llama.cpp's AMX kernels without it)"
                    if qtype:
                        note += f"; llama-quantize {'took %.1f s' % t_q if t_q else 'file reused'}"
                else:
                    note = pathlib.Path(srcs[name]).name
                print(f"{name:<10}{label:<13}{side:<16}{r['tok_s']:>9.1f}{r['rss_mb']:>13.0f}{r['ppl']:>12.4f}   {note}")
            print(f"{name:<10}{label:<13}{'orkpy / llama':<16}{o['tok_s'] / ll['tok_s']:>9.2f}"
                  f"{o['rss_mb'] / ll['rss_mb']:>13.2f}{o['ppl'] / ll['ppl'] - 1:>+12.2e}   "
                  "(ratios; PPL as a relative difference)", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
