import os
import pathlib

import numpy as np
import pytest

import orkpy

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = pathlib.Path(os.environ.get("ORKPY_SHARED", ROOT.parent / "shared"))

# ------------------------------------------------------------------ ISAs --
ALL_ISAS = ("scalar", "avx2", "neon")
WHERE_ELSE = {"avx2": "CI runs the AVX2 kernels natively on x86_64",
              "neon": "tests/test_c_kernels.py runs the NEON kernels under qemu-aarch64"}


def _isa_params(isas):
    """The ISAs of ``isas`` this CPU runs (an ISA it lacks is not generated: it is not a
    test here, and pytest_report_header says where it is covered instead)."""
    avail = orkpy.capabilities()["available"]
    return [pytest.param(isa, id=isa) for isa in isas if isa in avail]


def pytest_report_header(config):
    avail = orkpy.capabilities()["available"]
    missing = [f"{isa} ({WHERE_ELSE[isa]})" for isa in ALL_ISAS if isa not in avail]
    return [f"orkpy kernel ISAs tested here: {', '.join(avail)}"
            + (f"; not on this CPU: {'; '.join(missing)}" if missing else "")]


def pytest_generate_tests(metafunc):
    """A test taking ``isa`` runs once per kernel ISA this CPU has (scalar, avx2,
    neon), one taking ``simd_isa`` once per SIMD ISA: a failure names the ISA."""
    if "isa" in metafunc.fixturenames:
        metafunc.parametrize("isa", _isa_params(ALL_ISAS))
    if "simd_isa" in metafunc.fixturenames:
        metafunc.parametrize("simd_isa", _isa_params(ALL_ISAS[1:]))


# --------------------------------------------------------------- markers --
@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config, items):
    """Every accuracy gate is also slow: ``-m "not slow"`` is the fast loop."""
    for item in items:
        if item.get_closest_marker("gate") is not None and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def shared():
    """The ../shared data folder (skips with a reason when absent)."""
    if not SHARED.is_dir():
        pytest.skip(f"shared data folder not found at {SHARED} (set ORKPY_SHARED)")
    return SHARED


# --------------------------------------------------- NPU fake kernel (tests only) --
FAKE_KERNEL_ENV = "ORKPY_FAKE_KERNEL_LIB"


@pytest.fixture(scope="session")
def fake_kernel(tmp_path_factory):
    """The fake NPU kernel library (tests/npu_fake; the shipped extension has none), built by
    tests/cbuild.py and loaded into the core: ``Device(backend, fake_kernel=backend)`` works from
    here on. Its path is set in ``ORKPY_FAKE_KERNEL_LIB`` for subprocesses (tests/board/run_board.py
    --fake). Returns the path."""
    import sys
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from cbuild import build_fake_kernel
    finally:
        sys.path.remove(str(ROOT / "tests"))
    import orkpy.runtime.npu
    lib = build_fake_kernel(tmp_path_factory.mktemp("fake_npu"))
    orkpy.runtime.npu.load_fake_kernel(lib)
    os.environ[FAKE_KERNEL_ENV] = str(lib)
    return lib


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


def load_bench(name):
    """bench/<name>.py as a module, without putting bench/ on sys.path (bench/gguf.py would then
    shadow the gguf package for every later test)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(f"orkpy_bench_{name}", ROOT / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def block_passes(monkeypatch):
    """Every pass of rows through a block (orkpy.runtime.blocks.Block.run) recorded as
    (layer, Gram matrices collected, rows moved on, inputs captured), in order."""
    from orkpy.runtime import blocks
    passes = []
    real = blocks.Block.run

    def counted(self, stream, *a, **kw):
        got = real(self, stream, *a, **kw)
        passes.append((self.layer, list(kw.get("grams", ())), kw.get("advance", True), list(kw.get("capture", ()))))
        return got
    monkeypatch.setattr(blocks.Block, "run", counted)
    return passes
