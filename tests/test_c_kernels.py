"""C-level kernel tests: every SIMD kernel against the scalar _ref, natively
(AVX2 here) and as aarch64 NEON under qemu-aarch64."""
import re
import subprocess

import pytest

from cbuild import QEMU, ROOT, build, cross_tools_missing

C_TESTS = sorted((ROOT / "tests" / "c").glob("test_*.c"))


def _run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    m = re.search(r"^(\d+) passed, (\d+) failed$", p.stdout, re.M)
    assert m, f"no summary line; rc={p.returncode}\n{p.stdout}\n{p.stderr}"
    passed, failed = int(m.group(1)), int(m.group(2))
    assert failed == 0 and p.returncode == 0, p.stdout
    assert passed > 100, p.stdout
    return p.stdout


@pytest.mark.parametrize("src", C_TESTS, ids=lambda p: p.stem)
def test_c_native(src, tmp_path):
    out = _run([str(build(src, tmp_path, "native"))])
    assert "comparing" in out


@pytest.mark.parametrize("cpu", ["max", "cortex-a72"])
@pytest.mark.parametrize("src", C_TESTS, ids=lambda p: p.stem)
def test_c_neon_under_qemu(src, cpu, tmp_path):
    """qemu's "max" CPU has the dot-product extension, cortex-a72 has not:
    both the sdot and the plain-NEON kernels are proven against the _ref."""
    missing = cross_tools_missing()
    if missing:
        pytest.skip(f"cross tools absent: {', '.join(missing)} (apt-get install gcc-aarch64-linux-gnu qemu-user)")
    exe = build(src, tmp_path, "aarch64")
    out = _run([QEMU, "-cpu", cpu, str(exe)])
    if src.stem == "test_npu":  # the NPU pipeline and fake kernels, built for aarch64 (ABI asserts included)
        assert "comparing npu" in out
        return
    assert "comparing neon against scalar" in out
    if src.stem == "test_matmul":
        assert ("comparing neondot against scalar" in out) == (cpu == "max")
