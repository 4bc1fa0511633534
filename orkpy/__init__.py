"""orkpy: accurate NF4/int4/int8 quantization and int8 kernels for LLMs on the
Rockchip RK3588 NPU.

The hot paths live in a C core (``orkpy._core``); this package holds the
Python policy: argument checks, dataclasses, reports and the CLI.
"""
from ._core import (FormatError, GGUFError, NPUCommandError, NPUError, NPUTimeoutError, NPUUnavailableError,
                    UnavailableError)
from .actcal import ActCalibration
from .actspec import ACT_MODES, ActSpec
from .calibrate import QuantizedModel, calibrate_act_scales, calibrate_activations, collect_imatrix, quantize_model
from .convert import dequantize_gguf
from .cpu import capabilities, set_isa, use_isa
from .gguf import GGML_TYPES, GGUFFile, TensorInfo, ggml_type_info
from .gguf_write import write_gguf
from .imatrix import Imatrix
from .model import Model, load_model
from .packed import PackedWeight, load_packed, pack, save_packed
from .ppl import PPLResult, perplexity
from .recipe import Recipe, RecipeError
from .tiermap import TierEntry, TierMap, tier_map
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
from .safetensors import SafetensorsError, load_safetensors
from .tokenizer import Tokenizer
from . import npu  # noqa: F401 -- orkpy.npu works after a plain `import orkpy` (cheap: numpy + _core)

__version__ = "0.1.0"

__all__ = [
    "ACT_MODES",
    "ActCalibration",
    "ActSpec",
    "DEFAULT_CLIP_GRID",
    "FormatError",
    "GGML_TYPES",
    "GGUFError",
    "NPUCommandError",
    "NPUError",
    "NPUTimeoutError",
    "NPUUnavailableError",
    "GGUFFile",
    "Imatrix",
    "TensorInfo",
    "TierEntry",
    "TierMap",
    "Tokenizer",
    "ggml_type_info",
    "tier_map",
    "INT4_LEVELS",
    "KINDS",
    "Model",
    "NF4_LEVELS",
    "PPLResult",
    "PackedWeight",
    "QuantizedModel",
    "QuantizedTensor",
    "Recipe",
    "RecipeError",
    "SafetensorsError",
    "UnavailableError",
    "calibrate_act_scales",
    "calibrate_activations",
    "capabilities",
    "collect_imatrix",
    "dequantize",
    "dequantize_gguf",
    "load_safetensors",
    "load_model",
    "load_packed",
    "lut",
    "pack",
    "perplexity",
    "quantize",
    "quantize_model",
    "save_packed",
    "set_isa",
    "use_isa",
    "write_gguf",
]
