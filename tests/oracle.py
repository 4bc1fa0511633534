"""llama.cpp as the live oracle, and the real models, for the tests (issue 15).

`.ci/install` builds llama.cpp (from the llama-cpp-python sdist, `.ci/llama-oracle`)
and fetches the two real models (`.ci/fetch-models`) into a cache outside the clone:
``$ORKPY_CACHE`` (default ``~/.cache/orkpy``). This module finds them.

Missing pieces skip a test with the reason, except when ``ORKPY_REQUIRE_ORACLE=1``
(set by `.ci/run`): then they fail it, so CI can never count an absent oracle as a pass.

- :func:`llama_bin` -- a llama.cpp tool (``llama-perplexity``, ``llama-imatrix``,
  ``llama-tokenize``, ``llama-quantize``) or ``ork-oracle`` (tests/oracle/ork_oracle.c).
- :func:`real_model` -- ``"smollm2"`` or ``"gemma3"``, the quantized GGUF as shipped.
- :func:`oracle_tokens` -- llama.cpp's ids for a text file, as llama-perplexity
  tokenizes text (add_special, no special parsing).
- :func:`oracle_logits` -- llama.cpp's float32 logits for chunks of tokens (KV cache
  float32, flash attention off).
- :func:`oracle_greedy` -- llama.cpp's greedy continuation of a prompt (KV-cached decode, float32
  cache), and its timings.
- :func:`llama_tokenize_special` -- ``llama-tokenize``'s ids with the special tokens parsed (a
  chat prompt); :func:`llama_eog_ids` -- the end-of-generation ids its loader reports.
- :func:`llama_perplexity` -- run ``llama-perplexity`` and parse its final estimate.
- :func:`llama_quantize`, :func:`llama_imatrix` -- ``llama-quantize`` (optionally with an
  importance matrix) and ``llama-imatrix``.
- :func:`llama_kld` -- ``llama-perplexity``'s KL mode: PPL and mean KL divergence of a model
  against the log-probabilities a reference run saved.
"""
from __future__ import annotations

import os
import pathlib
import platform
import re
import subprocess
import tempfile
from typing import Dict, List, Optional, Sequence

import numpy as np
import pytest

CACHE = pathlib.Path(os.environ.get("ORKPY_CACHE", pathlib.Path.home() / ".cache" / "orkpy"))
LLAMA_VERSION = "0.3.36"  # llama-cpp-python sdist whose vendor/llama.cpp is the oracle
# .ci/llama-oracle's cache key: version + a portable CPU baseline (never -march=native)
LLAMA_FLAVOR = "x86_64-avx2" if platform.machine() == "x86_64" else f"{platform.machine()}-generic"
LLAMA_ROOT = CACHE / f"llama.cpp-{LLAMA_VERSION}-{LLAMA_FLAVOR}"
# ORKPY_LLAMA_BIN: another build's bin directory (benchmarks against a -march=native llama.cpp;
# the tests use the cached portable one)
BIN = pathlib.Path(os.environ["ORKPY_LLAMA_BIN"]) if os.environ.get("ORKPY_LLAMA_BIN") else LLAMA_ROOT / "bin"
MODELS = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3": "gemma-3-270m-q4_k_m.gguf"}


def required() -> bool:
    """True when a missing oracle or model must fail a test instead of skipping it (CI)."""
    return os.environ.get("ORKPY_REQUIRE_ORACLE", "") == "1"


def _missing(what: str) -> None:
    msg = f"{what} (run .ci/install, or set ORKPY_CACHE)"
    if required():
        pytest.fail(f"ORKPY_REQUIRE_ORACLE=1 but {msg}")
    pytest.skip(msg)


def llama_bin(name: str) -> pathlib.Path:
    """The path of a built llama.cpp tool or of ork-oracle; skips/fails when absent."""
    p = BIN / name
    if not (p.is_file() and os.access(p, os.X_OK)):
        _missing(f"llama.cpp tool {name} not built at {p}")
    return p


def real_model(name: str) -> pathlib.Path:
    """The path of a real model of :data:`MODELS` in the cache; skips/fails when absent."""
    p = CACHE / "models" / MODELS[name]
    if not p.is_file():
        _missing(f"real model {MODELS[name]} not fetched to {p}")
    return p


_EXIT_DELAY_C = ("#include <unistd.h>\n"
                 "__attribute__((destructor)) static void ork_exit_delay(void) { usleep(500000); }\n")


def _exit_delay() -> Optional[str]:
    """A preload library holding a tool's exit for 0.5 s (built once next to the tools, None
    without a C compiler): llama.cpp writes its log from a thread its exit can cut off
   , and under load the final figures were lost here (observed: 5 of 6 runs without this delay)."""
    so = BIN.parent / "ork-exit-delay.so"
    if not so.is_file():
        with tempfile.TemporaryDirectory() as d:
            c = pathlib.Path(d) / "d.c"
            c.write_text(_EXIT_DELAY_C)
            try:
                subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(c.with_suffix(".so")), str(c)],
                               capture_output=True, check=True)
            except (OSError, subprocess.CalledProcessError):
                return None
            os.replace(c.with_suffix(".so"), so)
    return str(so)


def _run(args: Sequence[str], timeout: float = 3600) -> str:
    env = dict(os.environ)
    delay = _exit_delay() if pathlib.Path(str(args[0])).name.startswith("llama-") else None
    if delay:
        env["LD_PRELOAD"] = " ".join(filter(None, [env.get("LD_PRELOAD"), delay]))
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))} failed ({r.returncode}):\n{r.stderr[-4000:]}")
    return r.stdout + r.stderr


def oracle_tokens(model: os.PathLike, text: os.PathLike) -> np.ndarray:
    """llama.cpp's token ids (int32) for the bytes of the file ``text``."""
    with tempfile.TemporaryDirectory() as d:
        out = pathlib.Path(d) / "ids"
        _run([llama_bin("ork-oracle"), "tokenize", model, text, out])
        return np.fromfile(out, dtype=np.int32)


def oracle_logits(model: os.PathLike, tokens: np.ndarray, n_ctx: int, first: int = 0,
                  threads: int = 2) -> np.ndarray:
    """llama.cpp's float32 logits, shape (n_chunk, n_ctx - first, n_vocab), for ``tokens``
    cut into ``len(tokens) // n_ctx`` chunks of ``n_ctx``, each decoded from an empty cache."""
    tokens = np.ascontiguousarray(tokens, dtype=np.int32)
    n_chunk = len(tokens) // n_ctx
    with tempfile.TemporaryDirectory() as d:
        tf, out = pathlib.Path(d) / "tokens", pathlib.Path(d) / "logits"
        tokens[: n_chunk * n_ctx].tofile(tf)
        _run([llama_bin("ork-oracle"), "logits", model, tf, n_ctx, first, threads, out])
        a = np.fromfile(out, dtype=np.float32)
    return a.reshape(n_chunk, n_ctx - first, -1)


def oracle_greedy(model: os.PathLike, prompt: np.ndarray, n_predict: int, threads: int = 2,
                  timing: Optional[Dict[str, float]] = None) -> np.ndarray:
    """llama.cpp's greedy continuation (int32 ids, at most ``n_predict``, stopping before an
    end-of-generation token) of the prompt ids: the prompt decoded as one batch, then one token
    at a time through its KV cache. ``timing`` receives prompt_ms, decode_tokens, decode_ms."""
    prompt = np.ascontiguousarray(prompt, dtype=np.int32)
    with tempfile.TemporaryDirectory() as d:
        tf, out = pathlib.Path(d) / "prompt", pathlib.Path(d) / "ids"
        prompt.tofile(tf)
        log = _run([llama_bin("ork-oracle"), "greedy", model, tf, n_predict, threads, out])
        ids = np.fromfile(out, dtype=np.int32)
    m = re.search(r"timing: prompt \d+ ([0-9.]+) ms, decode (\d+) tokens ([0-9.]+) ms", log)
    if timing is not None and m:
        timing.update(prompt_ms=float(m.group(1)), decode_tokens=int(m.group(2)), decode_ms=float(m.group(3)))
    return ids


def llama_tokenize_special(model: os.PathLike, text: str) -> List[int]:
    """``llama-tokenize``'s ids for ``text`` (its defaults: BOS as the vocabulary says, special
    tokens parsed; no escape processing)."""
    with tempfile.TemporaryDirectory() as d:
        f = pathlib.Path(d) / "prompt.txt"
        f.write_bytes(text.encode("utf-8"))
        out = _run([llama_bin("llama-tokenize"), "-m", model, "-f", f, "--ids", "--no-escape", "--log-disable"])
    m = re.search(r"^\[([0-9, ]*)\]\s*$", out, re.M)
    if not m:
        raise RuntimeError(f"no id list in llama-tokenize's output:\n{out[-2000:]}")
    return [int(x) for x in m.group(1).split(",") if x.strip()]


def llama_eog_ids(model: os.PathLike) -> List[int]:
    """The end-of-generation token ids llama.cpp's loader lists for ``model`` (its verbose log)."""
    out = _run([llama_bin("llama-tokenize"), "-m", model, "-p", "x", "--ids", "-v"])
    return sorted({int(x) for x in re.findall(r"EOG token\s+=\s+(\d+)", out)})


def llama_perplexity(model: os.PathLike, text: os.PathLike, n_ctx: int, chunks: int, threads: int = 2,
                     extra: Sequence[str] = ()) -> Dict[str, object]:
    """Run llama-perplexity; {"ppl": final estimate, "chunks": [running estimates], "tok_per_s": tokens per second of
    its first pass, or None,
    "output": full text}."""
    out = _run([llama_bin("llama-perplexity"), "-m", model, "-f", text, "-c", n_ctx, "--chunks", chunks,
                "-t", threads, "-tb", threads, *extra])
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", out)
    if not m:
        raise RuntimeError(f"no final estimate in llama-perplexity's output:\n{out[-3000:]}")
    running: List[float] = [float(x) for x in re.findall(r"\[\d+\]([0-9.]+)", out)]
    tps: Optional[float] = None
    t = re.search(r"([0-9.]+) seconds per pass", out)  # the first pass: n_seq chunks of n_ctx tokens
    s = re.search(r"n_seq\s*=\s*(\d+)", out)
    if t and float(t.group(1)) > 0:
        tps = n_ctx * min(int(s.group(1)) if s else 1, chunks) / float(t.group(1))
    return {"ppl": float(m.group(1)), "chunks": running, "tok_per_s": tps, "output": out}


def llama_quantize(src: os.PathLike, dst: os.PathLike, qtype: str, imatrix: Optional[os.PathLike] = None,
                   threads: int = 2) -> pathlib.Path:
    """``llama-quantize src dst qtype`` (e.g. ``"Q8_0"``, ``"Q4_K_M"``), with ``--imatrix`` when given."""
    _run([llama_bin("llama-quantize"), *(["--imatrix", imatrix] if imatrix else []), src, dst, qtype, threads])
    return pathlib.Path(dst)


def llama_imatrix(model: os.PathLike, text: os.PathLike, n_ctx: int, chunks: int, out: os.PathLike,
                  threads: int = 2) -> pathlib.Path:
    """``llama-imatrix``'s importance matrix of ``model`` on ``chunks`` chunks of ``n_ctx`` tokens of
    ``text``, written to ``out`` (GGUF format when it ends in .gguf)."""
    _run([llama_bin("llama-imatrix"), "-m", model, "-f", text, "-c", n_ctx, "--chunks", chunks, "-o", out,
          "-t", threads, "--no-ppl"])
    return pathlib.Path(out)


def llama_kld(model: os.PathLike, base: os.PathLike, text: Optional[os.PathLike] = None, n_ctx: int = 512,
              chunks: int = -1, threads: int = 2, tries: int = 3) -> Dict[str, object]:
    """With ``text``: score ``chunks`` chunks of it and save the log-probabilities to ``base`` (the
    reference run); {"ppl", "output"}. Without: llama-perplexity's KL mode against ``base`` (its
    tokens and chunks); {"ppl": PPL(Q), "ppl_base", "kld": mean KL divergence, "same_top": share,
    "output"}. llama.cpp's asynchronous log can lose its last lines at exit: a run whose figures
    are missing is repeated (``tries``)."""
    args = [llama_bin("llama-perplexity"), "-m", model, "--kl-divergence-base", base, "-c", n_ctx,
            "-t", threads, "-tb", threads]
    args += ["-f", text, "--chunks", chunks] if text is not None else ["--kl-divergence"]
    num = r"\s*[:=]\s*(-?[0-9.]+(?:e[-+]?\d+)?)"
    pats = {"ppl": r"Final estimate: PPL"} if text is not None else {
        "ppl": r"Mean PPL\(Q\)", "ppl_base": r"Mean PPL\(base\)", "kld": r"Mean\s+KLD", "same_top": r"Same top p"}
    for _ in range(tries):
        out = _run(args)
        got = {k: re.search(p + num, out) for k, p in pats.items()}
        if all(got.values()):
            res: Dict[str, object] = {k: float(m.group(1)) for k, m in got.items()}
            if "same_top" in res:
                res["same_top"] = float(res["same_top"]) / 100
            res["output"] = out
            return res
    raise RuntimeError(f"no {'final estimate' if text is not None else 'KL statistics'} in llama-perplexity's "
                       f"output ({tries} tries; fewer than 100 scored tokens?):\n{out[-3000:]}")
