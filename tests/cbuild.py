"""Build the C-level tests (tests/c/*.c + the C core) natively and for
aarch64 (run under qemu-aarch64). Used by tests/test_c_kernels.py.

Also the test-only fake NPU kernel (tests/npu_fake, not in the shipped
extension): linked into tests/c/test_npu.c, and built by build_fake_kernel()
into a small shared library that the Python tests load
(orkpy.runtime.npu.load_fake_kernel; csrc/ork/npu/device.h, "test kernels").

The core is compiled with the extension's own flags (buildflags.py, shared
with setup.py) plus -Werror. Each object is cached under ``objdir`` by a hash
of the compiler, its flags, the source and every header it may include, so
the core is compiled once per (compiler, flags) and each test binary only
compiles its own file and links.
"""
import concurrent.futures
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from buildflags import COMMON_FLAGS, DEFINES, LIBS, LINK_FLAGS, arch, per_file_flags  # noqa: E402

sys.path.remove(str(ROOT))
CORE = sorted((ROOT / "csrc" / "ork").glob("*.c")) + sorted((ROOT / "csrc" / "ork" / "npu").glob("*.c"))
FAKE_KERNEL = ROOT / "tests" / "npu_fake" / "fake_kernel.c"
# test files that link more than the core
EXTRA_SOURCES = {"test_npu": [FAKE_KERNEL]}
# link flags of one test: test_runtime fails chosen allocations through a wrapped calloc
EXTRA_LINK_FLAGS = {"test_runtime": ["-Wl,--wrap=calloc"]}
# what the fake kernel library needs of the core (its own hidden copies)
FAKE_KERNEL_CORE = [ROOT / "csrc" / "ork" / p for p in ("status.c", "npu/emu.c", "npu/regcmd.c")]
FLAGS = [*COMMON_FLAGS, *(f"-D{k}={v}" for k, v in DEFINES), "-Werror"]
CROSS_CC = "aarch64-linux-gnu-gcc"
QEMU = "qemu-aarch64"


def _headers_digest():
    h = hashlib.sha256()
    for p in (sorted((ROOT / "csrc").rglob("*.h")) + sorted((ROOT / "tests" / "c").glob("*.h"))
              + sorted((ROOT / "tests" / "npu_fake").glob("*.h"))):
        h.update(str(p.relative_to(ROOT)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _compile(cc, flags, src, objdir, headers):
    """src -> objdir/<stem>.<key>.o, compiled unless an object of the same key exists."""
    key = hashlib.sha256("\0".join([cc, *flags, headers, str(src)]).encode() + src.read_bytes()).hexdigest()[:20]
    obj = objdir / f"{src.stem}.{key}.o"
    if not obj.exists():
        fd, tmp = tempfile.mkstemp(suffix=".o", dir=objdir)
        os.close(fd)
        r = subprocess.run([cc, *flags, "-c", str(src), "-o", tmp], capture_output=True, text=True)
        if r.returncode != 0:
            os.unlink(tmp)
            raise RuntimeError(f"{cc} failed on {src}:\n{r.stderr}")
        os.replace(tmp, obj)  # atomic: a concurrent build sees the whole object or none
    return obj


def core_flags(src, target="native"):
    """The compiler flags of one source file in a C test build for target."""
    return [*FLAGS, *per_file_flags(src, "aarch64" if target == "aarch64" else arch())]


def build(test_src, outdir, target="native", objdir=None):
    """Compile the core (cached in objdir, default outdir) and the test file with
    each file's own flags, link, return the binary path."""
    cc = CROSS_CC if target == "aarch64" else "gcc"
    outdir = pathlib.Path(outdir)
    objdir = pathlib.Path(objdir) if objdir is not None else outdir
    objdir.mkdir(parents=True, exist_ok=True)
    headers = _headers_digest()
    srcs = CORE + EXTRA_SOURCES.get(pathlib.Path(test_src).stem, []) + [pathlib.Path(test_src)]
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as ex:
        objs = list(ex.map(lambda s: _compile(cc, core_flags(s, target), s, objdir, headers), srcs))
    exe = outdir / (pathlib.Path(test_src).stem + f".{target}")
    link = [cc, *map(str, objs), "-o", str(exe), *LINK_FLAGS, *EXTRA_LINK_FLAGS.get(pathlib.Path(test_src).stem, []),
            *(f"-l{lib}" for lib in LIBS)]
    if target == "aarch64":
        link.insert(1, "-static")
    subprocess.run(link, check=True, capture_output=True, text=True)
    return exe


def build_fake_kernel(outdir, objdir=None):
    """The fake NPU kernel as a shared library (native), outdir/libork_fake_npu.so: the fake and
    the core files it uses, compiled with the core's flags plus -fPIC -fvisibility=hidden, so its
    one exported symbol is ork_npu_fake_kernel_table(). Cached like the C tests' objects."""
    cc = "gcc"
    outdir = pathlib.Path(outdir)
    objdir = pathlib.Path(objdir) if objdir is not None else outdir
    objdir.mkdir(parents=True, exist_ok=True)
    headers = _headers_digest()
    srcs = FAKE_KERNEL_CORE + [FAKE_KERNEL]
    extra = ["-fPIC", "-fvisibility=hidden"]
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as ex:
        objs = list(ex.map(lambda s: _compile(cc, core_flags(s) + extra, s, objdir, headers), srcs))
    key = hashlib.sha256("\0".join(map(str, objs)).encode()).hexdigest()[:20]
    lib = outdir / f"libork_fake_npu.{key}.so"
    if not lib.exists():
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=outdir)
        os.close(fd)
        r = subprocess.run([cc, "-shared", *map(str, objs), "-o", tmp, "-Wl,--no-undefined", *LINK_FLAGS,
                            *(f"-l{lib}" for lib in LIBS)], capture_output=True, text=True)
        if r.returncode != 0:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise RuntimeError(f"linking the fake kernel library failed:\n{r.stderr}")
        os.replace(tmp, lib)
    return lib


def cross_tools_missing():
    missing = [t for t in (CROSS_CC, QEMU) if shutil.which(t) is None]
    return missing
