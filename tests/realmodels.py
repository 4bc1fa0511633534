"""The real models' float references for the tests (issue 15), made once per test process.

SmolLM2-135M (Q4_1/Q8_0) and Gemma-3-270M (Q4_K_M) ship quantized; their float reference
is their exact dequantization, written as an F32 GGUF by :func:`orkpy.formats.convert.dequantize_gguf`
(tests/test_real_models.py checks it tensor for tensor against the ``gguf`` package). Both
llama.cpp and orkpy run that file in the accuracy gates. The files go to one temporary folder
per process, removed at exit (about 0.5 GB and 1.1 GB)."""
from __future__ import annotations

import atexit
import pathlib
import shutil
import tempfile
from typing import Dict

from oracle import real_model

from orkpy.formats.convert import dequantize_gguf

_DIR: Dict[str, pathlib.Path] = {}
_F32: Dict[str, pathlib.Path] = {}


def work_dir() -> pathlib.Path:
    """A temporary folder for this test process (removed at exit)."""
    if "d" not in _DIR:
        d = pathlib.Path(tempfile.mkdtemp(prefix="orkpy-real-"))
        atexit.register(shutil.rmtree, d, True)
        _DIR["d"] = d
    return _DIR["d"]


def f32_reference(name: str) -> pathlib.Path:
    """The F32 GGUF of real model ``name`` ("smollm2" | "gemma3"): its exact dequantization
    (skips / fails as :func:`oracle.real_model` when the model is absent)."""
    if name not in _F32:
        src = real_model(name)
        dst = work_dir() / f"{name}-F32.gguf"
        dequantize_gguf(src, dst)
        _F32[name] = dst
    return _F32[name]
