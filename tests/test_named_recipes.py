"""Named recipes (orkpy/quantization/named.py, docs/recipes.md "Named recipes"): each one a valid
recipe with the keys it promises, reachable by `--recipe NAME` (a flag on top overrides its key, an
existing path is always a file), documented with its measured figure, and run end to end."""
import json
import pathlib
import re

import pytest

from orkpy.cli import main
from orkpy.quantization.named import NAMED, named_recipe
from orkpy.quantization.recipe import Recipe, RecipeError

ST = "models/stories260K/"
ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def calib_text(shared):
    """The calibration text: TinyStories (the scored texts elsewhere are wikitext-2)."""
    return (shared / "text" / "tinystories-val-B.txt").read_text(encoding="utf-8")[:60000]


def test_every_named_recipe_is_valid_and_documented():
    doc = (ROOT / "docs" / "recipes.md").read_text(encoding="utf-8")
    assert set(NAMED) == {"w8a8", "q4km", "w4a4-mix5"}
    for name, r in NAMED.items():
        rec = named_recipe(name)
        assert isinstance(rec, Recipe) and rec != Recipe()
        d = rec.to_dict()
        for sec, kv in r.keys.items():
            for k, v in kv.items():
                assert d[sec][k] == v, (name, sec, k)
        assert f"`{name}`" in doc, f"docs/recipes.md does not list {name}"
        figures = re.findall(r"\d\.\d{3,}", r.measured)
        assert figures and all(f in doc for f in figures), f"{name}: its figures are not in docs/recipes.md"
    assert named_recipe("w8a8").allocation.npu_bits == 8.0 and named_recipe("w8a8").rounding.method == "gptq"
    assert named_recipe("q4km").allocation.target_bpw == 5.5
    assert named_recipe("w4a4-mix5").allocation.npu_bits == 5.0 and named_recipe("w4a4-mix5").transform.rotate_online
    with pytest.raises(RecipeError, match="w8a8, q4km, w4a4-mix5"):
        named_recipe("q4")


def test_recipe_name_on_the_command_line(tmp_path, capsys, monkeypatch):
    assert main(["recipe", "--recipe", "q4km", "--target-bpw", "5.0"]) == 0
    r = Recipe.loads(capsys.readouterr().out)
    assert r.allocation.target_bpw == 5.0 and r.transform.rotate == "hadamard"   # the flag wins, the rest stays
    assert main(["recipe", "--recipe", "w4a4"]) == 1
    assert "no recipe named 'w4a4' (named recipes: w8a8, q4km, w4a4-mix5" in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)   # a file of that name is read as a file
    (tmp_path / "q4km").write_text(json.dumps({"version": 1, "rounding": {"seed": 7}}))
    assert main(["recipe", "--recipe", "q4km"]) == 0
    r = Recipe.loads(capsys.readouterr().out)
    assert r.rounding.seed == 7 and r.allocation.target_bpw is None


@pytest.mark.slow
def test_quantize_with_a_named_recipe(shared, tmp_path, calib_text, capsys):
    calib = tmp_path / "calib.txt"
    calib.write_text(calib_text, encoding="utf-8")
    out = tmp_path / "q"
    assert main(["quantize", str(shared / ST / "stories260K-F16.gguf"), "--recipe", "q4km", "--calib", str(calib),
                 "--calib-ctx", "128", "--calib-chunks", "2", "--no-progress", "-o", str(out)]) == 0
    rec = Recipe.load(out)
    assert rec.allocation.target_bpw == 5.5 and rec.rounding.method == "gptq" and rec.transform.rotate == "hadamard"
    assert "wrote " in capsys.readouterr().out
