"""Named recipes: what was measured to work, under a name (``orkpy quantize --recipe NAME``,
``orkpy recipe --recipe NAME``, :func:`named_recipe`). A row of :data:`NAMED` per recipe: its keys
(on top of :class:`~orkpy.quantization.recipe.Recipe`'s defaults), what it is for, and the figure
it reached, on what (docs/recipes.md lists them; the figures come from docs/results/).

A flag given beside ``--recipe NAME`` overrides that key, as with a recipe file. A path that
exists is always read as a file or model directory, never as a name.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping

from .recipe import Recipe, RecipeError

_NPU: Dict[str, Dict[str, Any]] = {"transform": {"rotate": "hadamard", "rotate_online": True},
                                   "calibration": {"ctx": 512, "chunks": 8},  # the 8 x 512 tokens measured
                                   "rounding": {"method": "gptq", "symmetric": False}, "activation": {"groups": True}}


@dataclass(frozen=True)
class NamedRecipe:
    """One named recipe: ``keys`` ({section: {key: value}}) over the defaults, ``summary`` (what
    it is for, what it needs), ``measured`` (the figure it reached, on what; docs/results/)."""
    name: str
    keys: Mapping[str, Mapping[str, Any]]
    summary: str
    measured: str

    def recipe(self) -> Recipe:
        d = Recipe().to_dict()
        for sec, kv in self.keys.items():
            d[sec].update(kv)
        return Recipe.from_dict(d)


def _merge(*parts: Mapping[str, Mapping[str, Any]]) -> Dict[str, Dict[str, Any]]:
    out: Dict[str, Dict[str, Any]] = {}
    for p in parts:
        for sec, kv in p.items():
            out.setdefault(sec, {}).update(kv)
    return out


NAMED: Dict[str, NamedRecipe] = {r.name: r for r in (
    NamedRecipe(
        "w8a8", _merge(_NPU, {"allocation": {"npu_bits": 8.0}}),
        "the NPU's 8-bit mode for every linear (int8 weights by GPTQ on a Hadamard-rotated model, int8 "
        "activations per token); needs --calib TEXT",
        "SmolLM2-135M, wikitext-2 8 x 512: mean KL 0.00330, PPL 24.540 against llama.cpp Q8_0's 0.00396 / 24.639 "
        "(float activations) -- below Q8_0 with 8-bit activations; Gemma-3-270M 0.00578 against Q8_0's 0.00250 "
        "(above it). 8 NPU bits per weight (docs/results/w4a4.md)"),
    NamedRecipe(
        "q4km", {"transform": {"rotate": "hadamard"}, "rounding": {"method": "gptq"},
                 "allocation": {"target_bpw": 5.5}},
        "a 4-bit-class model file at llama.cpp Q4_K_M's size (5.5 bits per linear weight: NF4 / int4 groups / "
        "int5 / int6 / int8 per linear by measured sensitivity, GPTQ on a Hadamard-rotated model); needs --calib TEXT",
        "SmolLM2-135M at Q4_K_M's own linear bytes (5.53 bits per weight), wikitext-2 8 x 512: mean KL 0.0177, PPL "
        "25.03 against llama.cpp Q4_K_M + imatrix's 0.0347 / 25.18 (docs/results/weight-accuracy.md)"),
    NamedRecipe(
        "w4a4-mix5", _merge(_NPU, {"allocation": {"npu_bits": 5.0, "npu_options": ["w4a4-g32", "w4a8-g32", "int8"]}}),
        "the NPU's 4-bit mode where it is accurate enough: W4A4 / W4A8 with affine int4 groups of 32, or W8A8, per "
        "linear at 5 NPU bits per weight on average (the board's bytes per token: 37 % fewer than W8A8); needs "
        "--calib TEXT",
        "SmolLM2-135M, wikitext-2 8 x 512: mean KL 0.0977, PPL 26.78 at 84.05 NPU MB per token (W8A8: 0.0033 at "
        "134.5). Not yet as accurate as a 4-bit weight-only format: Q4_K_M + imatrix 0.0347 (at 8 NPU bits) "
        "(docs/results/w4a4.md, eleventh session)"),
)}


#: the fewest calibration tokens GPTQ was measured to pay at (SmolLM2: 4 x 512 made it worse than round to
#: nearest with an imatrix; the measured recipes use 8 x 512)
GPTQ_MIN_TOKENS = 4096


def known_bad(recipe: Recipe) -> List[str]:
    """Warnings for settings measured to hurt (each with the figure and what to do instead): a
    rotation without GPTQ on the NF4 / int4 tiers; GPTQ on fewer than :data:`GPTQ_MIN_TOKENS`
    calibration tokens."""
    out = []
    t, r, c, a = recipe.transform, recipe.rounding, recipe.calibration, recipe.allocation
    if (t.rotate is not None or t.rotate_online) and r.method == "rtn" and a.npu_bits is None:
        out.append("warning: a Hadamard rotation with round to nearest was measured much worse than without it "
                   "(SmolLM2-135M, Q4_K_M allocation: mean KL 0.489 against 0.219): the rotation pays with "
                   "--method gptq; named recipes: --recipe q4km (docs/recipes.md)")
    if r.method == "gptq" and c.chunks is not None and c.ctx * c.chunks < GPTQ_MIN_TOKENS:  # None: the whole text
        out.append(f"warning: GPTQ on {c.chunks} x {c.ctx} = {c.ctx * c.chunks} calibration tokens was measured worse "
                   "than round to nearest with an imatrix (SmolLM2-135M, 4 x 512 tokens, Q4_K_M allocation: mean KL "
                   f"0.272 against 0.219); give at least {GPTQ_MIN_TOKENS} tokens (--calib-chunks 8 --calib-ctx 512)")
    return out


def resolve_recipe(spec: Any) -> Recipe:
    """A recipe given by name or path (``--recipe``, ``quantize_model(recipe=)``): an existing path is a
    recipe file or model directory (:meth:`Recipe.load`); else a :data:`NAMED` recipe; a word that is
    neither (no separator, no dot) is a RecipeError listing the names; anything else Recipe.load's error."""
    path = os.fspath(spec)
    if not os.path.exists(path) and isinstance(spec, str) and (spec in NAMED or (os.sep not in spec and "." not in spec)):
        return named_recipe(spec)
    return Recipe.load(path)


def named_recipe(name: str) -> Recipe:
    """The :class:`Recipe` of a :data:`NAMED` recipe; RecipeError listing the names otherwise."""
    r = NAMED.get(name)
    if r is None:
        raise RecipeError("recipe", f"no recipe named {name!r} (named recipes: {', '.join(NAMED)}; or give a recipe "
                                    "file or a model directory)")
    return r.recipe()


__all__ = ["GPTQ_MIN_TOKENS", "NAMED", "NamedRecipe", "known_bad", "named_recipe", "resolve_recipe"]
