"""Whole-model quantization against llama-quantize: time and peak memory at model scale.

    python bench/quant_model.py [--shapes 0.6B 1.7B 4B] [--threads 2] [--kind nf4] [--work DIR]

For each Qwen3 shape (random F16 weights, only the shapes matter: hidden / FFN / layers / heads of
Qwen3-0.6B, -1.7B, -4B and -8B (13.9 GB of F16; not in the default list), a 2048-token vocabulary,
tied head), in the same run and with the same
threads, each job in a fresh process (peak RSS from wait4, so every process is measured alone):

- ``llama-quantize F16 -> Q4_K_M`` (without and with an imatrix), and
- ``orkpy quantize`` of the same F16 file with llama.cpp's Q4_K_M file as the allocation oracle
  (without and with the same imatrix file), streamed into the model directory (one tensor at a
  time in memory).

``--recipe``: the calibrated recipe instead (issue 39): ``llama-imatrix`` on the calibration text
(8 x 512 tokens, their calibration pass) + ``llama-quantize Q4_K_M`` with that imatrix, against
``orkpy quantize`` with the recipe's flags (default: Hadamard rotation + GPTQ + the static
activation ranges, layer by layer, on the same text and the Q4_K_M file as the allocation; add
e.g. ``--recipe-flags="--awq"``; with ``--target-bpw B`` among them orkpy chooses its own tiers
instead, its sensitivities measured in the run), time against the sum of llama.cpp's two jobs and peak RSS
against the larger of theirs; orkpy's per-stage seconds from its log.

The imatrix is synthetic (positive random values per input column of every linear, in llama.cpp's
.dat format, the same file for both tools): a real one would need a forward pass of the model on
text, which random weights do not make meaningful. Prints seconds, peak RSS, and orkpy's speed-up
and memory ratio against llama.cpp, then peak RSS against the model's size (the scaling table).
"""
import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import pytest  # noqa: E402  (tests/oracle.py reports a missing tool as a pytest skip)
from oracle import llama_bin  # noqa: E402

from orkpy.formats.gguf_write import LazyTensor, write_gguf  # noqa: E402

#: Qwen3 config.json shapes: hidden, intermediate, layers, heads, KV heads (head_dim 128)
SHAPES = {"0.6B": (1024, 3072, 28, 16, 8), "1.7B": (2048, 6144, 28, 16, 8), "4B": (2560, 9728, 36, 32, 8),
          "8B": (4096, 12288, 36, 32, 8)}
VOCAB = 2048
HEAD_DIM = 128


def tensors_of(shape):
    """{tensor name: (N, K) or (D,)} of the shape (tied: no output.weight)."""
    D, F, L, H, KV = SHAPES[shape]
    out = {"token_embd.weight": (VOCAB, D), "output_norm.weight": (D,)}
    for i in range(L):
        p = f"blk.{i}."
        out.update({p + "attn_norm.weight": (D,), p + "attn_q.weight": (H * HEAD_DIM, D),
                    p + "attn_k.weight": (KV * HEAD_DIM, D), p + "attn_v.weight": (KV * HEAD_DIM, D),
                    p + "attn_q_norm.weight": (HEAD_DIM,), p + "attn_k_norm.weight": (HEAD_DIM,),
                    p + "attn_output.weight": (D, H * HEAD_DIM), p + "ffn_norm.weight": (D,),
                    p + "ffn_gate.weight": (F, D), p + "ffn_up.weight": (F, D), p + "ffn_down.weight": (D, F)})
    return out


def qwen3_meta(name, D, F, L, H, KV, head_dim, vocab):
    """GGUF metadata triples of a Qwen3-shaped model (``vocab``: tokens, scores, types of a byte-level
    SentencePiece vocabulary); shared with bench/qwen3_shape.py."""
    toks, scores, types = vocab
    return [("general.architecture", "STRING", "qwen3"), ("general.name", "STRING", name),
            ("qwen3.block_count", "UINT32", L), ("qwen3.context_length", "UINT32", 4096),
            ("qwen3.embedding_length", "UINT32", D), ("qwen3.feed_forward_length", "UINT32", F),
            ("qwen3.attention.head_count", "UINT32", H), ("qwen3.attention.head_count_kv", "UINT32", KV),
            ("qwen3.attention.key_length", "UINT32", head_dim), ("qwen3.attention.value_length", "UINT32", head_dim),
            ("qwen3.rope.freq_base", "FLOAT32", 1000000.0),
            ("qwen3.attention.layer_norm_rms_epsilon", "FLOAT32", 1e-6), ("general.file_type", "UINT32", 1),
            ("tokenizer.ggml.model", "STRING", "llama"), ("tokenizer.ggml.tokens", "ARRAY", toks),
            ("tokenizer.ggml.scores", "ARRAY", scores), ("tokenizer.ggml.token_type", "ARRAY", types),
            ("tokenizer.ggml.bos_token_id", "UINT32", 1), ("tokenizer.ggml.eos_token_id", "UINT32", 2),
            ("tokenizer.ggml.unknown_token_id", "UINT32", 0)]


def make_model(work, shape):
    """(F16 GGUF, imatrix .dat) of ``shape`` under ``work``, written once, one tensor at a time."""
    from orkpy.quantization.imatrix import Imatrix
    from orkpy.evaluation.synthetic import _vocab

    path = pathlib.Path(work) / f"qwen3-{shape}-shape-F16.gguf"
    imat = path.with_suffix(".imatrix.dat")
    shp = tensors_of(shape)
    D, F, L, H, KV = SHAPES[shape]
    if not path.exists():
        toks, scores, types = _vocab()
        n = VOCAB - len(toks)
        toks = toks + [f"<pad{i}>" for i in range(len(toks), VOCAB)]
        scores = np.append(scores, np.full(n, -1e9, np.float32))
        types = np.append(types, np.full(n, 5, np.int32)).astype(np.int32)
        meta = qwen3_meta(f"orkpy qwen3-{shape} shape", D, F, L, H, KV, HEAD_DIM, (toks, scores, types))

        def make(i, s):
            rng = np.random.default_rng(i)
            if len(s) == 1:
                return (1 + 0.1 * rng.standard_normal(s, dtype=np.float32)).astype(np.float32)
            return (rng.standard_normal(s, dtype=np.float32) * np.float32(1 / np.sqrt(s[1]))).astype(np.float16)

        write_gguf(path, meta, [(n, LazyTensor(s, np.float32 if len(s) == 1 else np.float16,
                                               lambda i=i, s=s: make(i, s))) for i, (n, s) in enumerate(shp.items())])
    if not imat.exists():
        im = Imatrix(chunks=1)
        rng = np.random.default_rng(12345)
        for n, s in shp.items():
            if len(s) == 2 and n != "token_embd.weight":
                im.add(n, (rng.random(s[1]) + 0.01) * 10, 10)
        im.save(imat)
    return path, imat


def run(cmd, errors=None):
    """(seconds, peak RSS bytes) of ``cmd`` run alone in a fresh process (wait4's rusage); the files the
    job before wrote are flushed first (sync), so no job pays for another's writeback. ``errors``: a
    list the job's stderr text is appended to."""
    os.sync()
    t0 = time.perf_counter()
    p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = b"", b""
    _, status, ru = os.wait4(p.pid, 0)
    dt = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    out, err = p.stdout.read(), p.stderr.read()
    if p.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({p.returncode}):\n{err.decode(errors='replace')[-3000:]}")
    if errors is not None:
        errors.append(err.decode(errors="replace"))
    return dt, ru.ru_maxrss * 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["0.6B", "1.7B", "4B"], choices=list(SHAPES))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kind", default="nf4", choices=["nf4", "int4"])
    ap.add_argument("--no-imatrix", action="store_true", help="only the rows without an imatrix")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "orkpy-quant-model"))
    ap.add_argument("--recipe", action="store_true", help="the calibrated recipe against llama-imatrix + llama-quantize")
    ap.add_argument("--recipe-flags", default="--rotate hadamard --method gptq",
                    help="orkpy quantize flags of the recipe (with --recipe)")
    ap.add_argument("--text", default=str(ROOT.parent / "shared" / "text" / "wikitext-2-raw-test.txt"),
                    help="calibration text (with --recipe)")
    ap.add_argument("--chunks", type=int, default=8, help="calibration chunks of 512 tokens (with --recipe)")
    a = ap.parse_args()
    if a.recipe:
        return recipe_main(a)
    try:
        lq = llama_bin("llama-quantize")
    except pytest.skip.Exception as e:
        sys.exit(f"quant_model: {e.msg}")
    os.makedirs(a.work, exist_ok=True)
    print(f"whole-model quantization, {a.threads} threads, each job alone in a fresh process; "
          f"load average {os.getloadavg()[0]:.2f} at the start")
    print(f"{'shape':<6}{'F16 GB':>8}  {'job':<12}{'orkpy s':>9}{'RSS GB':>8}{'llama s':>9}{'RSS GB':>8}"
          f"{'speed-up':>10}{'memory':>8}")
    scaling = []
    for shape in a.shapes:
        src, imat = make_model(a.work, shape)
        gb = src.stat().st_size / 1e9
        for use_im in ([False] if a.no_imatrix else [False, True]):
            job = "imatrix" if use_im else "no imatrix"
            q4km = pathlib.Path(a.work) / f"qwen3-{shape}-Q4_K_M{'-im' if use_im else ''}.gguf"
            lt, lrss = run([lq, *(["--imatrix", imat] if use_im else []), src, q4km, "Q4_K_M", a.threads])
            out = pathlib.Path(a.work) / f"qwen3-{shape}-orkpy{'-im' if use_im else ''}"
            ot, orss = run([sys.executable, "-m", "orkpy", "quantize", src, "--alloc", q4km, "--kind", a.kind,
                            *(["--imatrix", imat] if use_im else []), "-t", a.threads, "-o", out, "--overwrite",
                            "--no-progress"])
            print(f"{shape:<6}{gb:>8.2f}  {job:<12}{ot:>9.1f}{orss / 1e9:>8.2f}{lt:>9.1f}{lrss / 1e9:>8.2f}"
                  f"{lt / ot:>9.2f}x{orss / lrss:>7.2f}x", flush=True)
            scaling.append((shape, gb, job, orss))
    print("\npeak RSS against the model (orkpy quantize, streamed):")
    print(f"{'shape':<6}{'F16 GB':>8}  {'job':<12}{'peak RSS GB':>12}{'RSS / F16 file':>16}")
    for shape, gb, job, rss in scaling:
        print(f"{shape:<6}{gb:>8.2f}  {job:<12}{rss / 1e9:>12.3f}{rss / 1e9 / gb:>16.3f}")


def recipe_main(a):
    """The --recipe table (see module doc)."""
    try:
        lq, li = llama_bin("llama-quantize"), llama_bin("llama-imatrix")
    except pytest.skip.Exception as e:
        sys.exit(f"quant_model: {e.msg}")
    os.makedirs(a.work, exist_ok=True)
    flags = a.recipe_flags.split()
    print(f"calibrated recipe, {a.threads} threads, {a.chunks} x 512 calibration tokens of {os.path.basename(a.text)}, "
          f"each job alone in a fresh process; load average {os.getloadavg()[0]:.2f} at the start")
    own = "its own allocation" if "--target-bpw" in flags else "Q4_K_M allocation"
    print(f"orkpy: {' '.join(flags)} --calib TEXT ({own}); llama.cpp: llama-imatrix + llama-quantize Q4_K_M")
    print(f"{'shape':<6}{'F16 GB':>8}{'imatrix s':>11}{'quant s':>9}{'RSS GB':>8}{'orkpy s':>9}{'RSS GB':>8}"
          f"{'time':>8}{'memory':>8}")
    for shape in a.shapes:
        src, _ = make_model(a.work, shape)
        gb = src.stat().st_size / 1e9
        imat = pathlib.Path(a.work) / f"qwen3-{shape}-text.imatrix.dat"
        it, irss = run([li, "-m", src, "-f", a.text, "-c", 512, "--chunks", a.chunks, "-t", a.threads, "-o", imat,
                        "--no-ppl"])
        q4km = pathlib.Path(a.work) / f"qwen3-{shape}-Q4_K_M-textim.gguf"
        qt, qrss = run([lq, "--imatrix", imat, src, q4km, "Q4_K_M", a.threads])
        out = pathlib.Path(a.work) / f"qwen3-{shape}-orkpy-recipe"
        log = []
        alloc = [] if "--target-bpw" in flags else ["--alloc", q4km]  # a target size: orkpy's own allocation
        ot, orss = run([sys.executable, "-m", "orkpy", "quantize", src, *alloc, *flags, "--calib", a.text,
                        "--calib-chunks", a.chunks, "--calib-ctx", 512, "-t", a.threads, "-o", out, "--overwrite",
                        "--no-progress"], log)
        lt, lrss = it + qt, max(irss, qrss)
        print(f"{shape:<6}{gb:>8.2f}{it:>11.1f}{qt:>9.1f}{lrss / 1e9:>8.2f}{ot:>9.1f}{orss / 1e9:>8.2f}"
              f"{ot / lt:>7.2f}x{orss / lrss:>7.2f}x", flush=True)
        stages = [ln for ln in log[0].splitlines() if ln.startswith("stage seconds:")]
        if stages:
            print("       " + stages[-1])


if __name__ == "__main__":
    main()
