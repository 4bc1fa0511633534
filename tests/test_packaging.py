"""The source distribution is complete: everything the extension needs to build
(every C source and header), the licence, py.typed, and what the tests, docs,
notebooks and benchmarks need, so a machine with only the tarball (an RK3588
board without a prebuilt wheel) can build, test and read it. The whole
sdist -> wheel -> `orkpy info` / `orkpy gate` round trip runs in .ci/sdist-check."""
import email.parser
import importlib.util
import subprocess
import sys
import tarfile

import pytest

from cbuild import ROOT


@pytest.fixture(scope="module")
def sdist(tmp_path_factory):
    """(sdist path, names inside it relative to its top folder). Built from the
    working tree without build isolation or its dependency check (no download:
    `build` and setuptools>=77 come with the test extra; an sdist needs no wheel
    package and any numpy)."""
    if importlib.util.find_spec("build") is None:
        pytest.fail("the `build` package is missing: pip install -e '.[test]' (.ci/install does it)")
    out = tmp_path_factory.mktemp("sdist")
    r = subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--skip-dependency-check", "-o", str(out), str(ROOT)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (path,) = out.glob("orkpy-*.tar.gz")
    with tarfile.open(path) as t:
        names = [m.name for m in t.getmembers() if m.isfile()]
    top = names[0].split("/")[0]
    return path, {n[len(top) + 1:] for n in names}


def _tree(*patterns):
    return {str(p.relative_to(ROOT)) for pat in patterns for p in ROOT.glob(pat) if p.is_file()}


def test_sdist_has_every_c_source_and_header(sdist):
    _, names = sdist
    needed = _tree("csrc/**/*.c", "csrc/**/*.h")
    assert any(n.endswith(".h") for n in needed) and any(n.endswith(".c") for n in needed)
    assert needed - names == set()


def test_sdist_has_licence_typing_marker_docs_tests_and_benchmarks(sdist):
    _, names = sdist
    needed = {"LICENSE", "README.md", "pyproject.toml", "setup.py", "buildflags.py", "MANIFEST.in", "orkpy/py.typed",
              "tests/conftest.py", "tests/cbuild.py"}
    needed |= _tree("orkpy/*.py", "orkpy/*.pyi", "docs/*", "notebooks/*.ipynb", "bench/*.py", "tests/*.py",
                    "tests/c/*", "tests/npu_fake/*", "tests/fuzz/*", "tests/board/*")
    assert needed - names == set()
    assert not [n for n in names if "__pycache__" in n or n.endswith((".so", ".o", ".pyc"))]


def test_sdist_metadata_declares_runtime_deps_python_and_licence(sdist):
    path, _ = sdist
    with tarfile.open(path) as t:
        (member,) = [m for m in t.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO")]
        meta = email.parser.Parser().parsestr(t.extractfile(member).read().decode())
    deps = {d.split(">")[0].split("=")[0].split("<")[0].split(";")[0].strip() for d in meta.get_all("Requires-Dist")
            if "extra ==" not in d}
    assert {"numpy", "regex", "tqdm"} <= deps
    assert meta["Requires-Python"] == ">=3.10"
    assert meta["License-Expression"] == "MIT" and "LICENSE" in meta.get_all("License-File")
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")


def test_wheel_built_from_the_sdist_ships_py_typed_and_stubs(sdist, tmp_path):
    """build_py from the unpacked sdist alone (no compiler run) puts py.typed
    and the stubs (*.pyi) into the package, as the wheel gets them."""
    path, _ = sdist
    with tarfile.open(path) as t:
        t.extractall(tmp_path, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    (src,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    r = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path / "lib")],
                       cwd=src, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    shipped = {p.name for p in (tmp_path / "lib" / "orkpy").iterdir()}
    assert {"py.typed", "cli"} | {p.name for p in (ROOT / "orkpy").glob("*.pyi")} <= shipped


def test_readme_setup_commands_are_what_ci_runs():
    """The README's two commands use .ci/install's venv, and .ci/run ends with
    exactly the README's test command."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    install = "bash .ci/install && . .venv/bin/activate && orkpy info && orkpy gate"
    tests = ". .venv/bin/activate && python -m pytest -q"
    assert f"\n    {install}\n" in readme and f"\n    {tests}\n" in readme
    run = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert run[-1] == tests and "bash .ci/install" in run and "bash .ci/sdist-check" in run
    ci_install = (ROOT / ".ci" / "install").read_text()
    assert 'PY="${PYTHON:-python3}"' in ci_install and '"$PY" -m venv' in ci_install
    assert "/.venv" in (ROOT / ".gitignore").read_text().split()  # no trailing "/": a .venv symlink is ignored too
