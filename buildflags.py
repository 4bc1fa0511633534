"""The C compiler flags of orkpy's core, one rule for everything that compiles it:
setup.py (the extension that ships) and tests/cbuild.py (the C test binaries,
natively and for aarch64 under qemu), so the C tests run the code as shipped.

Every file gets COMMON_FLAGS (-ffp-contract=off: the kernels promise
bit-identical results across ISAs, so the compiler may never fuse a multiply
and an add on its own; where a contract wants a fused multiply-add, as the F32
GEMM's does (csrc/ork/gemm_f32.h), the code says so: fmaf, _mm256_fmadd_ps,
vfmaq_f32). Per file (``per_file_flags``): *_avx2.c gets -mavx2 -mfma on x86;
*_neondot.c gets the dot-product extension on aarch64 (plain NEON is baseline
there); model.c, linear.c and emu.c get -O3, which lets the compiler vectorize
their float loops (attention's fixed 8-lane dot products). Kernels are chosen at run time
(each family from csrc/ork/cpu.c's feature detection), so one build runs on any CPU of its architecture.

Not installed: setup.py and tests/cbuild.py import it from the source tree
(MANIFEST.in ships it in the sdist).
"""
import os
import platform

COMMON_FLAGS = ["-std=c11", "-O2", "-ffp-contract=off", "-fno-strict-aliasing", "-Wall", "-Wextra",
                "-Wno-unused-parameter", "-Wno-missing-field-initializers"]
DEFINES = [("_GNU_SOURCE", "1")]
LIBS = ["m", "dl"]  # libdl: sys_linux.c dlopens libdrm (dlopen lives there before glibc 2.34)
LINK_FLAGS = ["-pthread"]
O3_FILES = ("model.c", "linear.c", "emu.c", "quant.c", "gptq.c")


def arch(machine=None):
    """The architecture ("x86", "aarch64" or "other") of a platform.machine() value (default: this machine)."""
    m = (machine if machine is not None else platform.machine()).lower()
    if m in ("x86_64", "amd64", "i386", "i686"):
        return "x86"
    if m in ("aarch64", "arm64"):
        return "aarch64"
    return "other"


def per_file_flags(src, target_arch=None):
    """Flags appended after COMMON_FLAGS for one source file (a path or name),
    compiled for target_arch (arch(); default: this machine)."""
    name = os.path.basename(str(src))
    a = arch() if target_arch is None else target_arch
    if name.endswith("_avx2.c"):
        return ["-mavx2", "-mfma"] if a == "x86" else []
    if name in O3_FILES:
        return ["-O3"]
    if name.endswith("_neondot.c"):
        return ["-march=armv8.2-a+dotprod"] if a == "aarch64" else []
    return []


def compile_flags(src, target_arch=None):
    """The whole flag list of one core file, defines included (for a plain compiler command line)."""
    return [*COMMON_FLAGS, *(f"-D{k}={v}" for k, v in DEFINES), *per_file_flags(src, target_arch)]
