"""C-level kernel tests: every SIMD kernel against the scalar _ref, natively
(AVX2 here) and as aarch64 NEON under qemu-aarch64; GPTQ (its float64
multiply-accumulate has AVX2 and NEON kernels) and the input Gram matrix against
oracles on every ISA (tests/c/test_gptq.c).
The core is compiled with the extension's flags (buildflags.py), once per
compiler for the session."""
import re
import subprocess

import pytest

from cbuild import CORE, QEMU, ROOT, build, core_flags, cross_tools_missing

C_TESTS = sorted((ROOT / "tests" / "c").glob("test_*.c"))


@pytest.fixture(scope="session")
def objdir(tmp_path_factory):
    """Object files of the core shared by every C test binary of the session."""
    return tmp_path_factory.mktemp("cobj")


def test_c_tests_compile_the_core_with_the_extension_flags(monkeypatch):
    """Every core file gets, in a C test build, the flags setup.py gives it in the
    extension (plus -Werror): one rule, buildflags.py (e.g. -O3 for model.c)."""
    import runpy
    import setuptools
    captured = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kw: captured.update(kw))
    monkeypatch.chdir(ROOT)
    ns = runpy.run_path(str(ROOT / "setup.py"), run_name="setup")
    (ext,) = captured["ext_modules"]
    core = sorted(s for s in ext.sources if s.startswith("csrc/ork/"))
    assert core == sorted(str(p.relative_to(ROOT)) for p in CORE)
    defines = {f"-D{k}={v}" for k, v in ext.define_macros}
    for src in core:
        shipped = [*ext.extra_compile_args, *ns["per_file_flags"](src)]  # BuildExt appends the per-file flags
        tested = core_flags(ROOT / src)
        assert [f for f in tested if f != "-Werror" and not f.startswith("-D")] == shipped, src
        assert {f for f in tested if f.startswith("-D")} == defines and "-Werror" in tested
    assert core_flags(ROOT / "csrc/ork/model.c")[-1] == "-O3"


# test_npu.c's address-reuse part zeroes 6.4 GB of buffers per backend: it runs as its own (slow) test
ARGS = {"test_npu": ["no_address_reuse"]}
MIN_PASSED = {"test_runtime": 50}  # the runtime's state checks: fewer than the kernels' comparisons


def _run(cmd, min_passed=100):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    m = re.search(r"^(\d+) passed, (\d+) failed$", p.stdout, re.M)
    assert m, f"no summary line; rc={p.returncode}\n{p.stdout}\n{p.stderr}"
    passed, failed = int(m.group(1)), int(m.group(2))
    assert failed == 0 and p.returncode == 0, p.stdout
    assert passed > min_passed, p.stdout
    return p.stdout


def _qemu_or_skip():
    missing = cross_tools_missing()
    if missing:
        pytest.skip(f"cross tools absent: {', '.join(missing)} (apt-get install gcc-aarch64-linux-gnu qemu-user)")


@pytest.mark.parametrize("src", C_TESTS, ids=lambda p: p.stem)
def test_c_native(src, tmp_path, objdir):
    out = _run([str(build(src, tmp_path, "native", objdir)), *ARGS.get(src.stem, [])], MIN_PASSED.get(src.stem, 100))
    assert "comparing" in out
    if src.stem == "test_quant" and _cpu_flags() >= {"avx2", "avx512f", "avx512vl", "avx512bw", "avx512dq"}:
        assert "comparing avx2 (plain) against scalar" in out and "comparing avx512 against scalar" in out, out
    if src.stem == "test_gptq":
        assert "comparing gptq on scalar against the oracle" in out and "comparing the gram matrix on scalar" in out
    if src.stem == "test_gemm_f32" and _cpu_flags() >= {"avx2", "avx512f", "avx512vl", "avx512bw", "avx512dq"}:
        assert "comparing avx2 against scalar" in out and "comparing avx512 against scalar" in out, out


def _cpu_flags():
    """The x86 feature flags of /proc/cpuinfo (empty elsewhere)."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@pytest.mark.parametrize("cpu", ["max", "cortex-a72"])
@pytest.mark.parametrize("src", C_TESTS, ids=lambda p: p.stem)
def test_c_neon_under_qemu(src, cpu, tmp_path, objdir):
    """qemu's "max" CPU has the dot-product extension, cortex-a72 has not:
    both the sdot and the plain-NEON kernels are proven against the _ref."""
    _qemu_or_skip()
    exe = build(src, tmp_path, "aarch64", objdir)
    out = _run([QEMU, "-cpu", cpu, str(exe), *ARGS.get(src.stem, [])], MIN_PASSED.get(src.stem, 100))
    if src.stem == "test_runtime":  # no kernels: the runtime's state, built for aarch64
        assert "comparing the runtime" in out
        return
    if src.stem == "test_act_range":  # scalar double code: the aarch64 build against the values' exact error
        assert "comparing the range error" in out
        return
    if src.stem == "test_hadamard":  # scalar double code: the aarch64 build against the dense product
        assert "comparing the fast transform" in out
        return
    if src.stem == "test_npu":  # the NPU pipeline and fake kernels, built for aarch64 (ABI asserts included)
        assert "comparing npu" in out
        return
    if src.stem == "test_gptq":  # GPTQ (gptq_neon.c's kernel under neon) and the Gram matrix on each ISA vs the oracles
        for isa in ("scalar", "neon"):
            assert (f"comparing gptq on {isa} against the oracle" in out
                    and f"comparing the gram matrix on {isa} against its contract's sum" in out), out
    assert "comparing neon against scalar" in out
    if src.stem == "test_matmul":
        assert ("comparing neondot against scalar" in out) == (cpu == "max")


@pytest.mark.slow
@pytest.mark.parametrize("target", ["native", "aarch64"])
def test_c_npu_address_reuse(target, tmp_path, objdir):
    """Freed NPU address ranges are reused (emu and both fake kernels): 6.4 GB of
    short-lived buffers never exhaust the 32-bit space."""
    if target == "aarch64":
        _qemu_or_skip()
    exe = str(build(ROOT / "tests" / "c" / "test_npu.c", tmp_path, target, objdir))
    out = _run(([QEMU, "-cpu", "max"] if target == "aarch64" else []) + [exe, "address_reuse"], min_passed=2)
    assert "comparing" not in out and out.startswith("3 passed, 0 failed")
