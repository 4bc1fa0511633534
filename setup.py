"""Build of orkpy's C extension (orkpy._core).

The compiler flags (common and per file: SIMD flags for *_avx2.c and
*_neondot.c, -O3 for the float forward pass, -ffp-contract=off everywhere) are
one rule in buildflags.py, which tests/cbuild.py uses too: the C tests compile
what ships.
"""
import glob
import os
import sys

import numpy as np
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # PEP 517 backends leave the tree off sys.path
from buildflags import COMMON_FLAGS, DEFINES, LIBS, LINK_FLAGS, per_file_flags  # noqa: E402


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
# headers (buildflags.LIBS: libdl).
ext = Extension(
    "orkpy._core",
    sources=binding_sources + core_sources,
    include_dirs=[np.get_include(), "csrc"],
    define_macros=DEFINES,
    extra_compile_args=COMMON_FLAGS,
    extra_link_args=LINK_FLAGS,
    libraries=LIBS,
)

setup(ext_modules=[ext], cmdclass={"build_ext": BuildExt})
