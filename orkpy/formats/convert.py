"""The float reference of a quantized GGUF: its exact dequantization, written as an F32 GGUF.

A model shipped quantized (e.g. SmolLM2-135M Q4_1, Gemma-3-270M Q4_K_M) has no float
original at hand; its float reference is what its own types decode to.
:func:`dequantize_gguf` writes that file: the source's metadata in file order (only
``general.file_type`` is set to 0, llama.cpp's ``ALL_F32``), every tensor in the
source's order and shape as F32 holding exactly the values orkpy's C dequantizers
(the ggml formulas, checked against the ``gguf`` package) give, the source's alignment.
llama.cpp and orkpy then run the same float weights, so their perplexities can be
compared without either side's quantized kernels in the way. The file is written
atomically (a temporary sibling renamed into place); float32 needs 4 bytes per weight
in memory while it is written (about 1.1 GB for Gemma-3-270M).

    orkpy dequantize SmolLM2-135M-Instruct.Q4_1.gguf -o SmolLM2-135M-F32.gguf
"""
from __future__ import annotations

import os
from typing import Any, List, Optional, Tuple

import numpy as np
from numpy.typing import NDArray

from .._typing import StrPath
from .gguf import GGUFFile
from .gguf_write import metadata_triples, write_gguf

__all__ = ["dequantize_gguf", "FTYPE_ALL_F32"]

#: llama.cpp's ``general.file_type`` of a file whose tensors are all F32 (LLAMA_FTYPE_ALL_F32)
FTYPE_ALL_F32 = 0


def dequantize_gguf(src: StrPath, dst: StrPath, threads: Optional[int] = None) -> List[str]:
    """Write ``dst``: ``src`` with every tensor dequantized to F32 (see the module doc).
    Returns the source types that were dequantized (e.g. ``["Q4_1", "Q8_0"]``; F32 tensors
    are copied). ``src`` and ``dst`` must be different files."""
    src, dst = os.fspath(src), os.fspath(dst)
    if os.path.exists(dst) and os.path.samefile(src, dst):
        raise ValueError(f"{dst}: the output would overwrite its source")
    with GGUFFile(src) as g:
        meta: List[Tuple[str, str, Any]] = []
        for key, tname, value in metadata_triples(g):
            if key == "general.file_type":
                value = FTYPE_ALL_F32
            meta.append((key, tname, value))
        tensors: List[Tuple[str, NDArray[np.float32]]] = []
        types = set()
        for t in g.tensors:
            w = g.tensor(t.name, threads=threads)
            if w.shape != t.shape:  # the reader's contract; a mismatch would corrupt the file
                raise ValueError(f"{src}: tensor {t.name!r} dequantized to shape {w.shape}, expected {t.shape}")
            if t.type != "F32":
                types.add(t.type)
            tensors.append((t.name, np.ascontiguousarray(w, dtype=np.float32)))
        write_gguf(dst, meta, tensors, alignment=g.alignment)
    return sorted(types)
