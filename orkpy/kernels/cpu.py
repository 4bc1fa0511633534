"""Which kernels run: CPU feature detection and ISA selection.

The C core picks the best instruction set the CPU supports (AVX2 on x86-64,
NEON on aarch64) on first use. Setting the environment variable
``ORKPY_FORCE_SCALAR=1`` before the first call forces the scalar reference
kernels. Every ISA gives bit-identical results; only speed differs.
"""
from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator

from .. import _core

FORCE_SCALAR_ENV = "ORKPY_FORCE_SCALAR"


def capabilities() -> Dict[str, Any]:
    """Return a dict describing the CPU and the kernels in use.

    Keys: ``isa`` (the ISA whose kernels run now), ``available`` (ISAs this
    build can run here), ``forced_scalar`` (``ORKPY_FORCE_SCALAR`` was set),
    ``arch``, ``cpu_features`` (avx2, fma, neon, dotprod, avx512vnni, avx512: F/VL/BW/DQ), ``default_threads``,
    ``quant_kernels`` (the quantizer kernel table in use: under "avx2" it is "avx512" where the CPU has
    avx512 (the imatrix scale search's error kernels), unless ``ORKPY_NO_AVX512=1``), ``gemm_f32_kernels``
    (the float32 GEMM of the F32 linears in use: under "avx2" it is "avx512" where the CPU has
    avx512, unless ``ORKPY_NO_AVX512=1``) and ``matmul_kernels`` (the int8 /
    4-bit matmul table: under "avx2" it is "avx2vnni" where the CPU has avx512vl +
    avx512vnni, unless ``ORKPY_NO_VNNI=1``; under "neon" "neondot" with the dot-product
    extension) and ``i4_kernels`` (the int4 x int4 matmul of :mod:`orkpy.kernels.int4`: the ISA's table).
    Every table gives bit-identical results.
    """
    caps = _core.capabilities()
    caps["force_scalar_env"] = FORCE_SCALAR_ENV
    return caps


def set_isa(name: str) -> str:
    """Select the kernels by ISA name ("scalar", "avx2", "neon" or "auto").

    Returns the previous ISA name. Raises ``orkpy.UnavailableError`` if this
    CPU or build cannot run that ISA, ``ValueError`` for an unknown name.
    The choice is process-wide; prefer :func:`use_isa` in tests.
    """
    if not isinstance(name, str):
        raise TypeError(f"ISA name must be a str, got {type(name).__name__}")
    return _core.set_isa(name)


@contextlib.contextmanager
def use_isa(name: str) -> Iterator[None]:
    """Context manager: run the block with the given ISA's kernels."""
    prev = set_isa(name)
    try:
        yield
    finally:
        _core.set_isa(prev)
