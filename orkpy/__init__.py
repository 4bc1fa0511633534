"""orkpy: accurate NF4/int4/int8 quantization and int8 kernels for LLMs on the
Rockchip RK3588 NPU.

The hot paths live in a C core (``orkpy._core``); this package holds the
Python policy: argument checks, dataclasses, reports and the CLI.
"""
from ._core import FormatError, UnavailableError
from .cpu import capabilities, set_isa, use_isa
from .quant import (
    DEFAULT_CLIP_GRID,
    INT4_LEVELS,
    KINDS,
    NF4_LEVELS,
    QuantizedTensor,
    dequantize,
    lut,
    quantize,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_CLIP_GRID",
    "FormatError",
    "INT4_LEVELS",
    "KINDS",
    "NF4_LEVELS",
    "QuantizedTensor",
    "UnavailableError",
    "capabilities",
    "dequantize",
    "lut",
    "quantize",
    "set_isa",
    "use_isa",
]
