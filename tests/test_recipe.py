"""Quantization recipes (orkpy.quantization.recipe, docs/recipes.md): the format round-trips, a malformed recipe
is an error naming the key path and its line before any work, the keyword form and every
``orkpy quantize`` flag map onto the recipe, and on stories260K a recipe file, the equivalent
flags / keywords and the manifest's recorded recipe give byte-identical model directories."""
import ast
import inspect
import json
import os
import sys

import numpy as np
import pytest

import orkpy
from orkpy.quantization.recipe import (KEYWORDS, SECTIONS, AllocationSpec, Recipe, RecipeError,
                          RoundingSpec)

ST = "models/stories260K/"
HAVE_TOMLLIB = sys.version_info >= (3, 11)
needs_tomllib = pytest.mark.skipif(not HAVE_TOMLLIB, reason="TOML recipes need tomllib (Python 3.11+)")


def _files(d):
    """{file name: bytes} of a model directory (manifest.json included)."""
    return {fn: (d / fn).read_bytes() for fn in sorted(os.listdir(d))}


def assert_same_dir(a, b):
    fa, fb = _files(a), _files(b)
    assert sorted(fa) == sorted(fb)
    for fn in fa:
        assert fa[fn] == fb[fn], f"{fn} differs between {a.name} and {b.name}"


# ------------------------------------------------------------------ the format --

def test_defaults_and_round_trips(tmp_path):
    r = Recipe()
    d = r.to_dict()
    assert d["version"] == 1 and [s.NAME for s in SECTIONS] == list(d)[1:]
    assert Recipe.from_dict(d) == r and Recipe.from_dict({}) == r
    assert Recipe.loads(r.dumps()) == r
    custom = Recipe(transform=orkpy.quantization.recipe.TransformSpec(rotate="hadamard", rotate_seed=3),
                    allocation=AllocationSpec(kind="int4", group_size=64),
                    rounding=RoundingSpec(method="gptq", gptq_sequential=True, clip_grid=(1.0, 0.9)))
    assert custom != r and Recipe.loads(custom.dumps()) == custom
    assert Recipe.from_dict(json.loads(json.dumps(custom.to_dict()))) == custom
    p = tmp_path / "r.json"
    p.write_text(custom.dumps())
    assert Recipe.load(p) == custom
    # the same meaning, the same text: keys left out are their defaults
    assert Recipe.from_dict({"rounding": {"method": "gptq"}}).dumps() == \
        Recipe(rounding=RoundingSpec(method="gptq")).dumps()


@needs_tomllib
def test_toml_round_trip(tmp_path):
    r = Recipe(allocation=AllocationSpec(target_bpw=4.5, target_options=("int4", "int8")),
               rounding=RoundingSpec(clip_search="screen", sr=True, seed=5))
    text = r.dumps("toml")
    assert "null" not in text and "[allocation]" in text
    p = tmp_path / "r.toml"
    p.write_text("# a hand-written recipe may carry comments\n" + text)
    assert Recipe.load(p) == r


def test_toml_needs_tomllib_or_says_so(tmp_path, monkeypatch):
    p = tmp_path / "r.toml"
    p.write_text("[calibration]\nchunks = 4\n")
    if HAVE_TOMLLIB:
        assert Recipe.load(p).calibration.chunks == 4
    monkeypatch.setattr(sys, "version_info", (3, 10, 12))
    with pytest.raises(RecipeError, match=r"r\.toml: a TOML recipe needs Python 3\.11\+ .*write it as JSON"):
        Recipe.load(p)


JSON_BAD = '''{
  "version": 1,
  "calibration": {
    "ctx": 128,
    %s
  },
  "rounding": {
    "method": "gptq"
  }
}
'''

# (the line that replaces %s, the key path named, a piece of the message)
BAD_CASES = [
    ('"chunkz": 4', "calibration.chunkz", "unknown key (did you mean 'chunks'?)"),
    ('"chunks": "4"', "calibration.chunks", "must be an integer >= 1 or null (none), got '4'"),
    ('"chunks": 0', "calibration.chunks", "must be an integer >= 1 or null (none), got 0"),
    ('"chunks": true', "calibration.chunks", "must be an integer"),
    ('"chunks": 4.0', "calibration.chunks", "must be an integer"),
]


@pytest.mark.parametrize("line, key, msg", BAD_CASES)
def test_malformed_json_names_key_and_line(tmp_path, line, key, msg):
    p = tmp_path / "bad.json"
    p.write_text(JSON_BAD % line)
    with pytest.raises(RecipeError) as e:
        Recipe.load(p)
    assert e.value.key == key and e.value.line == 5 and msg in str(e.value)
    assert str(e.value).startswith(f"{p}:5: {key}")


@pytest.mark.parametrize("doc, key, line, msg", [
    # conflicting options: the checks quantize_model always made, now on the recipe
    ('{"rounding": {\n"method": "gptq",\n"clip_search": "full"}}', "rounding.clip_search", 3,
     "clip_search='full' applies to the plain rounding"),
    ('{"allocation": {"target_bpw": 4.5},\n "rounding": {\n\n "clip_search": "full"}}', "rounding.clip_search", 4,
     "clip_search='full'"),
    ('{"rounding": {"method": "gptq",\n "sr": true}}', "rounding.sr", 2, "exclude each other"),
    ('{"transform": {"smooth": 0.5},\n"rounding": {\n"awq": true}}', "rounding.awq", 3, "choose one"),
    ('{"allocation": {\n"target_bpw": 4.5,\n"group_size": 32}}', "allocation.group_size", 3,
     "chooses each linear's group size"),
    ('{"rounding": {\n"gptq_sequential": true}}', "rounding.gptq_sequential", 2, "applies to rounding.method='gptq'"),
    ('{"allocation": {\n"npu_per_linear": false}}', "allocation.npu_per_linear", 2, "applies to allocation.npu_bits"),
    ('{"allocation": {"npu_bits": 5,\n"npu_per_linear": 1}}', "allocation.npu_per_linear", 2, "must be true or false"),
    ('{"transform": {\n"rotate_placement": "online"}}', "transform.rotate_placement", 2, "needs transform.rotate"),
    # values out of range or of the wrong kind
    ('{"allocation": {\n"kind": "int8"}}', "allocation.kind", 2, "must be one of 'nf4', 'int4'"),
    ('{"allocation": {\n"group_size": 48}}', "allocation.group_size", 2, "multiple of 32"),
    ('{"allocation": {\n"threshold": 64}}', "allocation.threshold", 2, "must be a number in (0, 64)"),
    ('{"allocation": {\n"target_options": ["int4", "float"]}}', "allocation.target_options", 2, "not an integer tier"),
    ('{"transform": {\n"smooth": 1.5}}', "transform.smooth", 2, "must be a number in (0, 1]"),
    ('{"transform": {\n"rotate": "random"}}', "transform.rotate", 2, "'hadamard', 'orthogonal'"),
    ('{"rounding": {\n"clip_grid": []}}', "rounding.clip_grid", 2, "non-empty list"),
    ('{"activation": {\n"mode": "dynamic"}}', "activation.mode", 2, "activation.mode must be one of"),
    ('{"activation": {\n"n_outliers": 0}}', "activation.n_outliers", 2, "activation.n_outliers must be a positive int"),
    ('{"activation": {\n"prefix": -1}}', "activation.prefix", 2, "activation.prefix must be an int >= 0"),
    ('{"activation": {\n"bits": 5}}', "activation.bits", 2, "activation.bits must be one of [4, 8]"),
    ('{\n"version": 2}', "version", 2, "version must be 1"),
    ('{"transform": 3}', "transform", 1, "must be a table"),
    ('{\n"rounding": {},\n"allocaton": {}}', "allocaton", 3, "did you mean 'allocation'?"),
])
def test_malformed_recipes(tmp_path, doc, key, line, msg):
    p = tmp_path / "bad.json"
    p.write_text(doc)
    with pytest.raises(RecipeError) as e:
        Recipe.load(p)
    assert (e.value.key, e.value.line) == (key, line) and msg in str(e.value), str(e.value)
    assert str(e.value).startswith(f"{p}:{line}: ")


def test_not_json_names_the_line(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{\n  "rounding": {\n    "method": "gptq",\n  }\n}\n')
    with pytest.raises(RecipeError, match=r"bad\.json:4: not valid JSON"):
        Recipe.load(p)


@needs_tomllib
@pytest.mark.parametrize("doc, key, line, msg", [
    ("# comment\n[calibration]\nctx = 128\nchunkz = 4\n", "calibration.chunkz", 4, "did you mean 'chunks'?"),
    ("[rounding]\nmethod = 'gptq'\n\nsr = true\n", "rounding.sr", 4, "exclude each other"),
    ("version = 1\ncalibration.chunks = 0\n", "calibration.chunks", 2, "must be an integer >= 1"),
    ("[allocation]\nkind = 'int8'\n", "allocation.kind", 2, "must be one of"),
    ("[allocation]\nkind = \n", "", 2, "not valid TOML"),
])
def test_malformed_toml(tmp_path, doc, key, line, msg):
    p = tmp_path / "bad.toml"
    p.write_text(doc)
    with pytest.raises(RecipeError) as e:
        Recipe.load(p)
    assert e.value.key == key and msg in str(e.value) and str(e.value).startswith(f"{p}:{line}: "), str(e.value)


def test_errors_come_before_any_work(tmp_path, shared):
    """A malformed recipe, or one its inputs conflict with, fails before any file is read: the
    source does not exist, which would otherwise be the error."""
    missing = str(tmp_path / "no-such-source.gguf")
    alloc = shared / ST / "stories260K-Q4_0.gguf"
    quiet = dict(progress=False, log=lambda m: None)
    cases = [
        (dict(recipe=Recipe(allocation=AllocationSpec(target_bpw=4.5)), calib="x"), "allocation.target_bpw",
         "not both"),
        (dict(recipe=Recipe(rounding=RoundingSpec(method="gptq"))), "rounding.method", "needs calib="),
        (dict(recipe=Recipe.from_dict({"activation": {"mode": "static"}})), "activation.mode", "needs calib="),
        (dict(calib_chunks=0), "calibration.chunks", "must be an integer >= 1"),
        (dict(kind="int8"), "allocation.kind", "must be one of"),
        (dict(method="gptq", calib="x", clip_search="full"), "rounding.clip_search", "applies to the plain"),
        (dict(target_bpw=4.0, calib="x"), "allocation.target_bpw", "not both"),
    ]
    for kw, key, msg in cases:
        with pytest.raises(RecipeError, match=msg) as e:
            orkpy.quantize_model(missing, alloc, output=tmp_path / "out", **quiet, **kw)
        assert e.value.key == key
    with pytest.raises(RecipeError, match="alloc= is required") as e:
        orkpy.quantize_model(missing, None, **quiet)
    with pytest.raises(ValueError, match="recipe= and the recipe keyword"):
        orkpy.quantize_model(missing, alloc, recipe=Recipe(), kind="int4")
    assert not (tmp_path / "out").exists()
    with pytest.raises(FileNotFoundError):  # a valid recipe gets as far as the source
        orkpy.quantize_model(missing, alloc, recipe=Recipe(), **quiet)


# ------------------------------------------------------------------ the keyword form --

def test_keywords_map_onto_every_key():
    """Every recipe key but the runtime activation spec (load_model's act=, act_method=,
    act_outliers=) is a quantize_model keyword, whose default is the key's."""
    sig = inspect.signature(orkpy.quantize_model)
    default = Recipe()
    runtime_only = {("activation", "mode"), ("activation", "bits"), ("activation", "method"),
                    ("activation", "n_outliers")}
    every = {(c.NAME, k) for c in SECTIONS for k in c.keys()}
    assert set(KEYWORDS.values()) == every - runtime_only
    for kw, (sec, key) in KEYWORDS.items():
        assert sig.parameters[kw].default == getattr(getattr(default, sec), key), kw
    assert Recipe.from_kwargs(**default.to_kwargs()) == default
    r = Recipe.from_kwargs(calib_chunks=3, method="gptq", act_prefix=2, target_options=["int4", "int8"])
    assert (r.calibration.chunks, r.rounding.method, r.activation.prefix) == (3, "gptq", 2)
    assert r.allocation.target_options == ("int4", "int8")


# ------------------------------------------------------------------ on stories260K --

@pytest.fixture(scope="module")
def calib_text(shared):
    text = open(shared / "text" / "tinystories-val-B.txt", encoding="utf-8").read()
    return text[200_000:240_000]


def test_recipe_and_keywords_give_the_same_directory(shared, tmp_path, calib_text):
    src, alloc = shared / ST / "stories260K-F16.gguf", shared / ST / "stories260K-Q4_0.gguf"
    quiet = dict(progress=False, log=lambda m: None)
    kw = dict(method="gptq", calib_ctx=128, calib_chunks=2, group_size=32, rotate="hadamard", rotate_seed=4)
    orkpy.quantize_model(src, alloc, calib=calib_text, output=tmp_path / "kw", **kw, **quiet)
    p = tmp_path / "r.json"
    p.write_text(json.dumps({"transform": {"rotate": "hadamard", "rotate_seed": 4},
                             "calibration": {"ctx": 128, "chunks": 2},
                             "allocation": {"group_size": 32}, "rounding": {"method": "gptq"}}, indent=1))
    recipe = Recipe.load(p)
    assert recipe == Recipe.from_kwargs(**kw)
    qm = orkpy.quantize_model(src, alloc, calib=calib_text, recipe=recipe, output=tmp_path / "file", **quiet)
    assert qm.recipe == recipe
    assert_same_dir(tmp_path / "kw", tmp_path / "file")
    manifest = json.loads((tmp_path / "file" / "manifest.json").read_text())
    assert manifest["recipe"] == recipe.to_dict()
    assert str(tmp_path) not in (tmp_path / "file" / "manifest.json").read_text()  # inputs by name and sha256
    # the manifest's recipe, re-run, gives the same directory again
    again = Recipe.load(tmp_path / "file")
    assert again == recipe
    orkpy.quantize_model(src, alloc, calib=calib_text, recipe=again, output=tmp_path / "again", **quiet)
    assert_same_dir(tmp_path / "file", tmp_path / "again")
    # the comparison sees a difference where there is one
    orkpy.quantize_model(src, alloc, calib=calib_text, output=tmp_path / "other", **dict(kw, rotate_seed=5), **quiet)
    with pytest.raises(AssertionError, match="differs"):
        assert_same_dir(tmp_path / "file", tmp_path / "other")
    # the model directory loads as before, and records nothing the loader refuses
    m = orkpy.load_model(tmp_path / "again")
    assert m.forward(list(range(1, 9))).shape[0] == 8


def test_a_model_runs_in_the_activation_spec_its_recipe_names(shared, tmp_path, calib_text):
    """load_model(dir) / QuantizedModel.to_model() / orkpy ppl DIR without act= run the spec the
    manifest's recipe was made for; an explicit act= still wins; a directory without a recipe
    runs per token."""
    src, alloc = shared / ST / "stories260K-F16.gguf", shared / ST / "stories260K-Q4_0.gguf"
    recipe = Recipe.from_dict({"calibration": {"ctx": 128, "chunks": 2}, "activation": {"mode": "static", "method": "max"}})
    qm = orkpy.quantize_model(src, alloc, calib=calib_text, recipe=recipe, output=tmp_path / "s", progress=False,
                              log=lambda m: None)
    ids = list(range(1, 40))
    m = orkpy.load_model(tmp_path / "s")
    assert {s.act for s in m.linears.values() if s.path == "packed"} == {"static"}
    static = orkpy.load_model(tmp_path / "s", act="static", act_method="max").forward(ids)
    assert np.array_equal(m.forward(ids), static) and np.array_equal(qm.to_model().forward(ids), static)
    per_token = orkpy.load_model(tmp_path / "s", act="per_token").forward(ids)
    assert not np.array_equal(per_token, static)                      # the explicit spec wins
    assert orkpy.load_model(tmp_path / "s", act="per_token").linears["blk.0.attn_q.weight"].act == "per_token"
    mp = tmp_path / "s" / "manifest.json"
    man = json.loads(mp.read_text())
    man["recipe"]["activation"] = {"mode": "warp"}                    # a spec no registry row serves
    mp.write_text(json.dumps(man))
    with pytest.raises(orkpy.FormatError, match="recipe.activation"):
        orkpy.load_model(tmp_path / "s")
    del man["recipe"]                                                 # a directory from before recipes
    mp.write_text(json.dumps(man))
    assert np.array_equal(orkpy.load_model(tmp_path / "s").forward(ids), per_token)


def test_manifest_without_recipe_is_a_clear_error(tmp_path, shared):
    src, alloc = shared / ST / "stories260K-F16.gguf", shared / ST / "stories260K-Q4_0.gguf"
    orkpy.quantize_model(src, alloc, progress=False, log=lambda m: None, output=tmp_path / "m")
    mp = tmp_path / "m" / "manifest.json"
    m = json.loads(mp.read_text())
    assert Recipe.from_dict(m["recipe"]) == Recipe()
    del m["recipe"]
    mp.write_text(json.dumps(m))
    with pytest.raises(RecipeError, match="without a recipe"):
        Recipe.load(tmp_path / "m")


# ------------------------------------------------------------------ function lengths --

def test_no_long_functions_in_the_pipeline():
    """No function over 120 lines in the recipe, the stages or the orchestration; quantize_model's
    code (its docstring aside) fits about a screen."""
    pkg = os.path.join(os.path.dirname(orkpy.__file__), "quantization")
    for mod in ("recipe.py", "pipeline.py", "calibrate.py"):
        tree = ast.parse(open(os.path.join(pkg, mod), encoding="utf-8").read())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                assert n <= 120, f"{mod}: {node.name} is {n} lines"
                if node.name == "quantize_model":
                    body = node.body[1:] if isinstance(node.body[0], ast.Expr) else node.body
                    assert body[-1].end_lineno - body[0].lineno + 1 <= 60


# ------------------------------------------------------------------ the command line --

def _quantize_parser():
    from orkpy.cli import build_parser
    sub = build_parser()._subparsers._group_actions[0]
    return sub.choices["quantize"], sub.choices["recipe"]


# every recipe option of `orkpy quantize`: (argv, the key path, the value it sets)
FLAG_CASES = {
    "rotate": (["--rotate", "hadamard"], "transform.rotate", "hadamard"),
    "rotate_online": (["--rotate-online"], "transform.rotate_online", True),
    "smooth": (["--smooth", "0.5"], "transform.smooth", 0.5),
    "calib_ctx": (["--calib-ctx", "128"], "calibration.ctx", 128),
    "calib_chunks": (["--calib-chunks", "3"], "calibration.chunks", 3),
    "threshold": (["--threshold", "4"], "allocation.threshold", 4.0),
    "literal_types": (["--literal-types"], "allocation.fallback", "literal"),
    "target_bpw": (["--target-bpw", "4.5"], "allocation.target_bpw", 4.5),
    # --npu-bits also sets the W4A4 machinery (rotations, GPTQ) unless given: here given, so only its key changes
    "npu_bits": (["--rotate", "hadamard", "--rotate-online", "--method", "gptq", "--act-groups", "--symmetric",
                  "--npu-bits", "5"], "allocation.npu_bits", 5.0),
    "npu_tiers": (["--npu-tiers", "w4a4", "int8"], "allocation.npu_options", ("w4a4", "int8")),
    "npu_per_group": (["--rotate", "hadamard", "--rotate-online", "--method", "gptq", "--act-groups", "--symmetric",
                       "--npu-bits", "5", "--npu-per-group"], "allocation.npu_per_linear", False),
    "act_groups": (["--act-groups"], "activation.groups", True),
    "symmetric": (["--no-symmetric"], "rounding.symmetric", False),
    "kind": (["--kind", "int4"], "allocation.kind", "int4"),
    "group_size": (["--group-size", "64"], "allocation.group_size", 64),
    "tied_lookup": (["--tied-lookup", "packed"], "allocation.tied_lookup", "packed"),
    "method": (["--method", "gptq"], "rounding.method", "gptq"),
    "gptq_sequential": (["--method", "gptq", "--gptq-sequential"], "rounding.gptq_sequential", True),
    "gptq_precision": (["--method", "gptq", "--gptq-precision", "float32"], "rounding.gptq_precision", "float32"),
    "awq": (["--awq"], "rounding.awq", True),
    "sr": (["--sr"], "rounding.sr", True),
    "seed": (["--seed", "7"], "rounding.seed", 7),
    "clip_search": (["--clip-search", "full"], "rounding.clip_search", "full"),
}


def _get(recipe, path):
    sec, key = path.split(".")
    return getattr(getattr(recipe, sec), key)


def test_every_quantize_option_maps_onto_the_recipe(capsys):
    from orkpy.cli import main
    from orkpy.cli.quantize import CLI_KEYS, CLI_NOT_RECIPE
    quantize, recipe_cmd = _quantize_parser()
    dests = {a.dest for a in quantize._actions}
    assert dests == set(CLI_KEYS) | CLI_NOT_RECIPE, "a quantize option is neither a recipe key nor listed as an input"
    assert not set(CLI_KEYS) & CLI_NOT_RECIPE and set(FLAG_CASES) == set(CLI_KEYS)
    assert {a.dest for a in recipe_cmd._actions} >= set(CLI_KEYS)
    assert main(["recipe"]) == 0
    assert Recipe.loads(capsys.readouterr().out) == Recipe()  # the flags' defaults are the recipe's
    for dest, (argv, path, value) in FLAG_CASES.items():
        assert main(["recipe", *argv]) == 0
        r = Recipe.loads(capsys.readouterr().out)
        assert _get(r, path) == value and CLI_KEYS[dest] == path, dest
        changed = {p for p in ("%s.%s" % (c.NAME, k) for c in SECTIONS for k in c.keys())
                   if _get(r, p) != _get(Recipe(), p)}
        flag = {d: [x for x in a if x.startswith("--")][-1] for d, (a, _, _) in FLAG_CASES.items()}
        assert changed == {CLI_KEYS[d] for d in FLAG_CASES if flag[d] in argv}, dest  # that key (and its prerequisite)


def test_recipe_command_overrides_and_formats(tmp_path, capsys):
    from orkpy.cli import main
    base = tmp_path / "base.json"
    base.write_text(Recipe(rounding=RoundingSpec(method="gptq", seed=2)).dumps())
    assert main(["recipe", "--recipe", str(base), "--calib-chunks", "4", "--method", "rtn"]) == 0
    r = Recipe.loads(capsys.readouterr().out)
    assert (r.rounding.method, r.rounding.seed, r.calibration.chunks) == ("rtn", 2, 4)
    assert main(["recipe", "--recipe", str(base)]) == 0  # flags not given keep the recipe's keys
    assert Recipe.loads(capsys.readouterr().out) == Recipe.load(base)
    assert main(["recipe", "--method", "gptq", "--sr"]) == 1
    err = capsys.readouterr().err
    assert "rounding.sr" in err and "exclude each other" in err and "(option --sr)" in err
    if HAVE_TOMLLIB:
        assert main(["recipe", "--awq", "--format", "toml", "-o", str(tmp_path / "r.toml")]) == 0
        assert Recipe.load(tmp_path / "r.toml") == Recipe(rounding=RoundingSpec(awq=True))


def test_cli_malformed_recipe_fails_before_any_work(tmp_path, capsys):
    from orkpy.cli import main
    bad = tmp_path / "bad.json"
    bad.write_text(JSON_BAD % '"chunks": 0')
    out = tmp_path / "sub" / "out"
    assert main(["quantize", str(tmp_path / "missing.gguf"), "--alloc", str(tmp_path / "missing-alloc.gguf"),
                 "--recipe", str(bad), "-o", str(out), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:5: calibration.chunks must be an integer >= 1" in err
    assert not (tmp_path / "sub").exists()  # not even the output's parent folder was made


def test_cli_flags_recipe_and_manifest_give_the_same_directory(shared, tmp_path, calib_text, capsys):
    """`orkpy quantize --recipe R` and the equivalent flags write byte-identical model directories, and
    the manifest's recipe run again gives the same directory once more."""
    from orkpy.cli import main
    calib = tmp_path / "calib.txt"
    calib.write_text(calib_text, encoding="utf-8")
    io = [str(shared / ST / "stories260K-F16.gguf"), "--alloc", str(shared / ST / "stories260K-Q4_0.gguf"),
          "--calib", str(calib), "--no-progress"]
    flags = ["--awq", "--calib-ctx", "128", "--calib-chunks", "2", "--group-size", "32", "--kind", "int4"]
    assert main(["quantize", *io, *flags, "-o", str(tmp_path / "flags")]) == 0
    assert main(["recipe", *flags, "-o", str(tmp_path / "r.json")]) == 0
    assert main(["quantize", *io, "--recipe", str(tmp_path / "r.json"), "-o", str(tmp_path / "recipe")]) == 0
    assert_same_dir(tmp_path / "flags", tmp_path / "recipe")
    assert main(["quantize", *io, "--recipe", str(tmp_path / "recipe"), "-o", str(tmp_path / "again")]) == 0
    assert_same_dir(tmp_path / "flags", tmp_path / "again")
    assert main(["quantize", *io, "--recipe", str(tmp_path / "recipe"), "--kind", "nf4",
                 "-o", str(tmp_path / "nf4")]) == 0  # a flag on top of a recipe overrides its key
    capsys.readouterr()
    assert Recipe.load(tmp_path / "nf4").allocation.kind == "nf4"
    with pytest.raises(AssertionError, match="differs"):
        assert_same_dir(tmp_path / "flags", tmp_path / "nf4")
