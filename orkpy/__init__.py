"""orkpy: accurate NF4/int4/int8 quantization and int8 kernels for LLMs on the
Rockchip RK3588 NPU.

The hot paths live in a C core (``orkpy._core``); this package holds the
Python policy: argument checks, dataclasses, reports and the CLI.
"""
import sys
from importlib import import_module
from importlib.abc import Loader
from importlib.machinery import ModuleSpec
from importlib.util import spec_from_loader
from types import ModuleType
from typing import Optional

from ._core import (FormatError, GGUFError, NPUCommandError, NPUError, NPUTimeoutError, NPUUnavailableError,
                    UnavailableError)
from .runtime.actcal import ActCalibration
from .kernels.actspec import ACT_MODES, ActSpec
from .quantization.calibrate import QuantizedModel, calibrate_act_scales, calibrate_activations, collect_imatrix, quantize_model
from .formats.convert import dequantize_gguf
from .kernels.cpu import capabilities, set_isa, use_isa
from .formats.gguf import GGML_TYPES, GGUFFile, TensorInfo, ggml_type_info
from .formats.gguf_write import write_gguf
from .quantization.imatrix import Imatrix
from .runtime.model import Model, load_model
from .kernels.packed import PackedWeight, load_packed, pack, save_packed
from .evaluation.ppl import PPLResult, perplexity
from .quantization.recipe import Recipe, RecipeError
from .formats.tiermap import TierEntry, TierMap, tier_map
from .kernels.quant import (
    DEFAULT_CLIP_GRID,
    INT4_LEVELS,
    KINDS,
    NF4_LEVELS,
    QuantizedTensor,
    dequantize,
    lut,
    quantize,
)
from .formats.safetensors import SafetensorsError, load_safetensors
from .runtime.tokenizer import Tokenizer
from .runtime import npu  # noqa: F401 -- orkpy.npu works after a plain `import orkpy` (cheap: numpy + _core)


#: where each module of the earlier flat layout lives now (docs/architecture.md "Layout"): ``orkpy.model`` is
#: ``orkpy.runtime.model``, the same module object, so code written against the flat paths keeps working
MOVED = {
    "actcal": "runtime",
    "alloc": "quantization",
    "arch": "formats",
    "awq": "quantization",
    "calibrate": "quantization",
    "convert": "formats",
    "cpu": "kernels",
    "ffn": "evaluation",
    "gate": "evaluation",
    "generate": "runtime",
    "gguf": "formats",
    "gguf_write": "formats",
    "gptq": "quantization",
    "imatrix": "quantization",
    "model": "runtime",
    "modeldir": "formats",
    "npu": "runtime",
    "packed": "kernels",
    "ppl": "evaluation",
    "quant": "kernels",
    "reference": "kernels",
    "report": "evaluation",
    "rotate": "runtime",
    "safetensors": "formats",
    "source": "formats",
    "synthetic": "evaluation",
    "table": "evaluation",
    "testing": "evaluation",
    "tiermap": "formats",
    "tokenizer": "runtime",
}


class _MovedFinder:
    """Resolves ``orkpy.<old>`` to its module in the stage subpackages (imported on first use)."""

    @staticmethod
    def find_spec(name: str, path: object = None, target: object = None) -> Optional[ModuleSpec]:
        head, _, tail = name.partition(".")
        top, _, rest = tail.partition(".")
        if head != "orkpy" or top not in MOVED:
            return None
        return spec_from_loader(name, _MovedLoader(f"orkpy.{MOVED[top]}.{tail}"))


class _MovedLoader(Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        return import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        pass


sys.meta_path.insert(0, _MovedFinder())  # before the path finders: an editable install of the flat layout must not win

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
