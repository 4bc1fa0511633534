"""The public API is typed: every callable in ``orkpy.__all__`` (and every public
method of the public classes) is fully annotated, the package ships ``py.typed`` and
a stub for the C extension, and mypy (configured in pyproject.toml) passes."""
import importlib.util
import inspect
import os
import subprocess
import sys

import pytest

import orkpy
from orkpy import _core

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.dirname(os.path.abspath(orkpy.__file__))
HAVE_MYPY = importlib.util.find_spec("mypy") is not None
needs_mypy = pytest.mark.skipif(not HAVE_MYPY, reason="mypy is not installed (pip install -e '.[test]' brings it)")


def _own_functions(cls):
    """(name, function) for the functions a public class defines in orkpy's source: public
    methods, dunders, properties, class- and static methods (not dataclass-generated ones)."""
    out = []
    for klass in cls.__mro__:
        if klass is object or not klass.__module__.startswith("orkpy"):
            continue
        for name, attr in vars(klass).items():
            if name.startswith("_") and not (name.startswith("__") and name.endswith("__")):
                continue
            if isinstance(attr, property):
                fns = [f for f in (attr.fget, attr.fset) if f is not None]
            elif isinstance(attr, (classmethod, staticmethod)):
                fns = [attr.__func__]
            elif inspect.isfunction(attr):
                fns = [attr]
            else:
                continue
            for f in fns:
                src = inspect.getsourcefile(f) or ""
                if os.path.abspath(src).startswith(PKG + os.sep):  # orkpy/ or a subpackage of it
                    out.append((f"{cls.__name__}.{name}", f))
    return out


def _public_callables():
    out = []
    for name in orkpy.__all__:
        obj = getattr(orkpy, name)
        if inspect.isclass(obj):
            if issubclass(obj, BaseException):
                continue  # the exception classes: constructors are BaseException's
            out += _own_functions(obj)
        elif inspect.isbuiltin(obj):
            # a C function re-exported as is: typed by orkpy/_core.pyi
            assert getattr(obj, "__module__", None) == "orkpy._core", name
        elif callable(obj):
            out.append((name, obj))
    return out


def _missing_annotations(fn):
    sig = inspect.signature(fn)
    missing = []
    params = list(sig.parameters.values())
    if params and params[0].name in ("self", "cls") and "." in fn.__qualname__:
        params = params[1:]
    for p in params:
        if p.annotation is inspect.Parameter.empty:
            missing.append(p.name)
    if sig.return_annotation is inspect.Signature.empty:
        missing.append("return")
    return missing


def test_public_api_is_fully_annotated():
    found = _public_callables()
    names = {n for n, _ in found}
    # the walk really reaches functions, methods, properties and classmethods
    assert {"quantize", "use_isa", "GGUFFile.tensor", "GGUFFile.architecture", "TierMap.load",
            "Tokenizer.encode", "Model.forward", "PackedWeight.matmul", "Imatrix.save",
            "QuantizedModel.save", "PPLResult.to_json"} <= names, sorted(names)
    missing = {n: m for n, fn in found if (m := _missing_annotations(fn))}
    assert not missing, f"unannotated parameters/returns in the public API: {missing}"


def test_annotation_check_catches_an_unannotated_function():
    def f(x, y: int = 0):
        return x

    def g(x: int) -> int:
        return x

    assert _missing_annotations(f) == ["x", "return"]
    assert _missing_annotations(g) == []


def test_package_ships_typing_markers():
    assert os.path.isfile(os.path.join(PKG, "py.typed")), "orkpy/py.typed is missing (PEP 561)"
    stub = os.path.join(PKG, "_core.pyi")
    assert os.path.isfile(stub)
    # every public name of the C extension is described by the stub
    with open(stub, encoding="utf-8") as f:
        text = f.read()
    runtime = {n for n in dir(_core) if not n.startswith("_")}
    undeclared = sorted(n for n in runtime if f"def {n}(" not in text and f"class {n}(" not in text
                        and f"class {n}:" not in text)
    assert not undeclared, f"orkpy/_core.pyi does not declare {undeclared}"


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory):
    """One mypy cache for this module's runs (outside the repository)."""
    return str(tmp_path_factory.mktemp("mypy-cache"))


@pytest.mark.slow
@needs_mypy
def test_mypy_passes(mypy_cache):
    """``python -m mypy`` with the [tool.mypy] settings of pyproject.toml (files = orkpy)."""
    r = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", mypy_cache], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, f"mypy failed:\n{r.stdout}{r.stderr}"
    assert "Success: no issues found" in r.stdout


@pytest.mark.slow
@needs_mypy
def test_stub_matches_the_extension():
    """mypy's stubtest: orkpy/_core.pyi against the built module (every name on both sides,
    functions vs classes, exception bases, final C types). It writes no cache."""
    r = subprocess.run([sys.executable, "-m", "mypy.stubtest", "orkpy._core", "--mypy-config-file",
                        os.path.join(ROOT, "pyproject.toml")], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, f"stubtest failed:\n{r.stdout}{r.stderr}"


@pytest.mark.slow
@needs_mypy
def test_mypy_rejects_a_wrong_call(tmp_path, mypy_cache):
    """The annotations have teeth: a caller passing the wrong types is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("import orkpy\n"
                   "q = orkpy.quantize([[1.0]], kind=4)\n"
                   "n: str = orkpy.load_model('m.gguf').n_vocab\n")
    r = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", mypy_cache, "--no-error-summary", str(bad)],
                       cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, MYPYPATH=ROOT))
    assert r.returncode == 1, r.stdout + r.stderr
    assert 'Argument "kind" to "quantize" has incompatible type "int"' in r.stdout, r.stdout
    assert "bad.py:3: error: Incompatible types in assignment" in r.stdout, r.stdout
