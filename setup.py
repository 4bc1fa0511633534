"""Build of orkpy's C extension (orkpy._core).

Per-file SIMD flags: a source named *_avx2.c gets -mavx2 -mfma (x86 only),
*_neon.c needs nothing extra on aarch64 (Advanced SIMD is baseline). Every
file gets -ffp-contract=off: the kernels promise bit-identical results across
ISAs, and a fused multiply-add would break that. Kernels are chosen at run
time (csrc/ork/cpu.c), so one wheel runs on any CPU of its architecture.
"""
import glob
import os
import platform

import numpy as np
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

MACHINE = platform.machine().lower()
IS_X86 = MACHINE in ("x86_64", "amd64", "i386", "i686")

COMMON_FLAGS = ["-std=c11", "-O2", "-ffp-contract=off", "-fno-strict-aliasing", "-Wall", "-Wextra",
                "-Wno-unused-parameter", "-Wno-missing-field-initializers"]


def per_file_flags(src):
    name = os.path.basename(src)
    if name.endswith("_avx2.c"):
        return ["-mavx2", "-mfma"] if IS_X86 else []
    if name in ("model.c", "emu.c"):
        return ["-O3"]  # lets the compiler vectorize the fixed 8-lane float dot products
    if name.endswith("_neondot.c"):
        return ["-march=armv8.2-a+dotprod"] if MACHINE in ("aarch64", "arm64") else []
    return []


class BuildExt(build_ext):
    def build_extensions(self):
        compiler = self.compiler
        original = compiler._compile

        def _compile(obj, src, ext, cc_args, extra_postargs, pp_opts):
            return original(obj, src, ext, cc_args, list(extra_postargs) + per_file_flags(src), pp_opts)

        compiler._compile = _compile
        try:
            super().build_extensions()
        finally:
            compiler._compile = original


core_sources = sorted(glob.glob("csrc/ork/*.c") + glob.glob("csrc/ork/npu/*.c"))
binding_sources = sorted(glob.glob("csrc/py/*.c"))


# The rknpu/rocket device backends load libdrm.so.2 with dlopen when a device
# is opened (csrc/ork/npu/sys_linux.c): nothing here links it or needs its
# headers. libdl: dlopen lives there before glibc 2.34.
ext = Extension(
    "orkpy._core",
    sources=binding_sources + core_sources,
    include_dirs=[np.get_include(), "csrc"],
    define_macros=[("_GNU_SOURCE", "1")],
    extra_compile_args=COMMON_FLAGS,
    extra_link_args=["-pthread"],
    libraries=["m", "dl"],
)

setup(ext_modules=[ext], cmdclass={"build_ext": BuildExt})
