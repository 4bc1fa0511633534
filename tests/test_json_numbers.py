"""orkpy's JSON readers refuse out-of-range numbers and mistyped fields at read time with their
documented error naming the file and the field (attack campaign, issue 5): a 400-digit integer
used to escape as OverflowError (float() of it) and a prefix of 10**30 passed the act_scales reader
and failed later, in the C core, at load_model(act="static")."""
import json
import pathlib
import sys

import numpy as np
import pytest

import orkpy
from orkpy import FormatError
from orkpy.kernels.actspec import ActSpec
from orkpy.quantization.recipe import Recipe, RecipeError
from orkpy.runtime.actcal import ActCalibration, check_prefix

BIG = 10 ** 400
NAME = "blk.0.attn_q.weight"


def _act_file(tmp_path):
    cal = ActCalibration({NAME: {"max": 2.0, "mse": 1.5, "mse4": 1.0}}, {NAME: [3, 1]}, {NAME: [2.0, 1.5]},
                         info={"model": "m.gguf", "n_ctx": 64, "chunks": 2, "tokens_sha256": "0" * 64, "prefix": 1,
                               "grid": {"per_octave": 32, "octaves": 12}},
                         clipped={NAME: {"mse": 0.01}})
    p = tmp_path / "act_scales.json"
    cal.save(p)
    return p, json.loads(p.read_text())


def _set(doc, path, v):
    o = doc
    for k in path[:-1]:
        o = o[k]
    o[path[-1]] = v


ACT_CASES = {   # name: (key path, value, what the message names)
    "max 400 digits": (("linears", NAME, "max"), BIG, "'max'"),
    "mse 400 digits": (("linears", NAME, "mse"), BIG, "'mse'"),
    "mse4 400 digits": (("linears", NAME, "mse4"), BIG, "'mse4'"),
    "max beyond float32": (("linears", NAME, "max"), 1e300, "'max'"),
    "max negative int": (("linears", NAME, "max"), -BIG, "'max'"),
    "max a string": (("linears", NAME, "max"), "1", "'max'"),
    "outlier_absmax 400 digits": (("linears", NAME, "outlier_absmax"), [BIG, 1.0], "'outlier_absmax'"),
    "outlier_absmax negative": (("linears", NAME, "outlier_absmax"), [-1.0, 1.0], "'outlier_absmax'"),
    "outlier_absmax beyond float32": (("linears", NAME, "outlier_absmax"), [1e39, 1.0], "'outlier_absmax'"),
    "outlier_absmax a string": (("linears", NAME, "outlier_absmax"), ["x", 1.0], "'outlier_absmax'"),
    "outliers 400 digits": (("linears", NAME, "outliers"), [BIG, 1], "'outliers'"),
    "clipped 400 digits": (("linears", NAME, "clipped", "mse"), BIG, "'clipped'"),
    "clipped beyond 1": (("linears", NAME, "clipped", "mse"), 2.0, "'clipped'"),
    "clipped true": (("linears", NAME, "clipped", "mse"), True, "'clipped'"),
    "prefix 10**30": (("info", "prefix"), 10 ** 30, "'prefix'"),
    "prefix 400 digits": (("info", "prefix"), BIG, "'prefix'"),
    "prefix 2**31": (("info", "prefix"), 2 ** 31, "'prefix'"),
    "prefix not below n_ctx": (("info", "prefix"), 64, "'prefix'"),
    "n_ctx 400 digits": (("info", "n_ctx"), BIG, "'n_ctx'"),
    "n_ctx a float": (("info", "n_ctx"), 64.0, "'n_ctx'"),
    "chunks 0": (("info", "chunks"), 0, "'chunks'"),
    "chunks a string": (("info", "chunks"), "2", "'chunks'"),
    "grid octaves 10**30": (("info", "grid", "octaves"), 10 ** 30, "'octaves'"),
    "grid a list": (("info", "grid"), [32, 12], "'grid'"),
    "model a number": (("info", "model"), 5, "'model'"),
}


@pytest.mark.parametrize("case", sorted(ACT_CASES))
def test_act_scales_numbers_out_of_range_are_format_errors(tmp_path, case):
    p, doc = _act_file(tmp_path)
    path, value, field = ACT_CASES[case]
    _set(doc, path, value)
    p.write_text(json.dumps(doc))
    with pytest.raises(FormatError) as e:
        ActCalibration.load(p)
    assert type(e.value) is FormatError and str(p) in str(e.value) and field in str(e.value), str(e.value)


def test_act_scales_good_file_still_loads(tmp_path):
    p, doc = _act_file(tmp_path)
    cal = ActCalibration.load(p)
    assert cal.prefix == 1 and cal.ranges[NAME]["mse4"] == 1.0 and cal.clipped[NAME] == {"mse": 0.01}
    _set(doc, ("linears", NAME, "max"), 10 ** 30)   # an int within float32 is a number like any other
    del doc["info"]["n_ctx"]                         # a hand-made file: info keys are optional
    p.write_text(json.dumps(doc))
    assert ActCalibration.load(p).ranges[NAME]["max"] == float(np.float32(1e30))


@pytest.mark.parametrize("prefix", [10 ** 30, 2 ** 63, 2 ** 31])
def test_act_prefix_beyond_2_31_is_a_value_error_not_overflow(prefix):
    """load_model(act_prefix=...), calibrate_activations(prefix=...) and a recipe's activation
    prefix reach the C core as a Py_ssize_t: 10**30 escaped as OverflowError."""
    with pytest.raises(ValueError, match="act_prefix"):
        ActSpec("static", prefix=prefix)
    with pytest.raises(ValueError, match="act_prefix"):
        check_prefix(prefix)
    with pytest.raises(ValueError, match="act_outliers"):
        ActSpec("per_token_outliers", n_outliers=prefix)


# ------------------------------------------------------------------- manifest.json --

FUZZ = pathlib.Path(__file__).resolve().parent / "fuzz"


@pytest.fixture(scope="module")
def model_dir():
    sys.path.insert(0, str(FUZZ))
    try:
        import pytargets
    finally:
        sys.path.remove(str(FUZZ))
    d = pathlib.Path(pytargets._model_dir())
    good = (d / "manifest.json").read_bytes()
    yield d, good
    (d / "manifest.json").unlink(missing_ok=True)
    (d / "manifest.json").write_bytes(good)
    pytargets.cleanup()


@pytest.mark.parametrize("act", [{"mode": "per_tensor", "prefix": 10 ** 30}, {"mode": "static", "prefix": BIG},
                                 {"mode": "per_token_outliers", "n_outliers": 10 ** 30},
                                 {"mode": "per_tensor", "prefix": 1.5}])
def test_manifest_recipe_activation_out_of_range_is_a_format_error(model_dir, act):
    """A model directory's recipe.activation with a prefix of 10**30 loaded and escaped from the C core
    as OverflowError when the model was built (the shared-range modes use the prefix)."""
    d, good = model_dir
    m = json.loads(good)
    m["recipe"]["activation"] = dict(m["recipe"]["activation"], **act)
    (d / "manifest.json").unlink()
    (d / "manifest.json").write_text(json.dumps(m))
    try:
        with pytest.raises(FormatError, match="recipe.activation") as e:
            orkpy.load_model(d)
        assert str(d) in str(e.value)
    finally:
        (d / "manifest.json").unlink()
        (d / "manifest.json").write_bytes(good)


# ------------------------------------------------------------------------ recipes --

RECIPE_CASES = {
    "threshold 400 digits": (("allocation", "threshold"), BIG),
    "target_bpw 400 digits": (("allocation", "target_bpw"), BIG),
    "npu_bits 400 digits": (("allocation", "npu_bits"), BIG),
    "smooth 400 digits": (("transform", "smooth"), BIG),
    "clip_grid 400 digits": (("rounding", "clip_grid"), [1.0, BIG]),
    "clip_grid beyond float32": (("rounding", "clip_grid"), [1.0, 1e39]),
    "ctx 10**30": (("calibration", "ctx"), 10 ** 30),
    "chunks 10**30": (("calibration", "chunks"), 10 ** 30),
    "target_ctx 10**30": (("allocation", "target_ctx"), 10 ** 30),
    "target_chunks 400 digits": (("allocation", "target_chunks"), BIG),
    "seed -1": (("rounding", "seed"), -1),
    "seed 2**64": (("rounding", "seed"), 2 ** 64),
    "rotate_seed 2**64": (("transform", "rotate_seed"), 2 ** 64),
    "prefix 10**30": (("activation", "prefix"), 10 ** 30),
    "n_outliers 10**30": (("activation", "n_outliers"), 10 ** 30),
}


@pytest.mark.parametrize("case", sorted(RECIPE_CASES))
def test_recipe_numbers_out_of_range_are_recipe_errors(tmp_path, case):
    (sec, key), value = RECIPE_CASES[case]
    d = Recipe().to_dict()
    d[sec][key] = value
    p = tmp_path / "r.json"
    p.write_text(json.dumps(d, indent=1))
    with pytest.raises(RecipeError) as e:
        Recipe.load(p)
    assert str(p) in str(e.value) and key in str(e.value), str(e.value)


def test_recipe_seeds_at_the_ends_of_their_range_load(tmp_path):
    d = Recipe().to_dict()
    d["rounding"]["seed"] = d["transform"]["rotate_seed"] = 2 ** 64 - 1
    d["calibration"]["ctx"] = 2 ** 31 - 1
    p = tmp_path / "r.json"
    p.write_text(json.dumps(d))
    r = Recipe.load(p)
    assert r.rounding.seed == 2 ** 64 - 1 and r.calibration.ctx == 2 ** 31 - 1


# --------------------------------------------------------- NPU precision map (bench) --

def test_npu_precision_map_deep_nesting_is_a_value_error(tmp_path):
    """orkpy.runtime.npu_cost.read_alloc documents ValueError: a JSON nested 100,000 deep escaped as
    RecursionError."""
    from orkpy.runtime.npu_cost import read_alloc
    p = tmp_path / "alloc.json"
    p.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(ValueError, match="not valid JSON") as e:
        read_alloc(p, {})
    assert str(p) in str(e.value)


# ------------------------------------------------ a number literal beyond a double --

def test_json_number_beyond_a_double_is_refused_by_every_reader(tmp_path, model_dir):
    """fuzz act_scales: a literal such as 1e999 (in an info key orkpy keeps but does not use) parsed
    as infinity, so the calibration loaded and then could not be saved (ValueError from the JSON
    writer). act_scales.json, manifest.json and recipes now refuse it when read."""
    p, doc = _act_file(tmp_path)
    doc["info"]["note"] = "@@"
    p.write_text(json.dumps(doc).replace('"@@"', "1e999"))
    with pytest.raises(FormatError, match="out of the range of a double") as e:
        ActCalibration.load(p)
    assert str(p) in str(e.value)
    r = tmp_path / "r.json"
    d = Recipe().to_dict()
    d["allocation"]["threshold"] = "@@"
    r.write_text(json.dumps(d).replace('"@@"', "1e999"))
    with pytest.raises(RecipeError, match="out of the range of a double"):
        Recipe.load(r)
    d, good = model_dir
    (d / "manifest.json").unlink()
    (d / "manifest.json").write_bytes(good.replace(b'"int8_share": ', b'"int8_share": 1e999, "x": '))
    try:
        with pytest.raises(FormatError, match="out of the range of a double"):
            orkpy.load_model(d)
    finally:
        (d / "manifest.json").unlink()
        (d / "manifest.json").write_bytes(good)
