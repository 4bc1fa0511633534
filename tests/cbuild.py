"""Build the C-level tests (tests/c/*.c + the C core) natively and for
aarch64 (run under qemu-aarch64). Used by tests/test_c_kernels.py."""
import pathlib
import platform
import shutil
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[1]
CORE = sorted((ROOT / "csrc" / "ork").glob("*.c")) + sorted((ROOT / "csrc" / "ork" / "npu").glob("*.c"))
FLAGS = ["-std=c11", "-O2", "-D_GNU_SOURCE", "-ffp-contract=off", "-Wall", "-Wextra",
         "-Wno-unused-parameter", "-Wno-missing-field-initializers", "-Werror"]
CROSS_CC = "aarch64-linux-gnu-gcc"
QEMU = "qemu-aarch64"
IS_X86 = platform.machine().lower() in ("x86_64", "amd64")


def per_file_flags(src, target):
    if src.name.endswith("_avx2.c") and target == "x86_64":
        return ["-mavx2", "-mfma"]
    if src.name.endswith("_neondot.c") and target == "aarch64":
        return ["-march=armv8.2-a+dotprod"]
    return []


def build(test_src, outdir, target="native"):
    """Compile each file with its own flags, link, return the binary path."""
    cc = CROSS_CC if target == "aarch64" else "gcc"
    arch = "aarch64" if target == "aarch64" else ("x86_64" if IS_X86 else "other")
    outdir = pathlib.Path(outdir)
    objs = []
    for src in CORE + [pathlib.Path(test_src)]:
        obj = outdir / (src.stem + f".{target}.o")
        cmd = [cc, *FLAGS, *per_file_flags(src, arch), "-c", str(src), "-o", str(obj)]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        objs.append(str(obj))
    exe = outdir / (pathlib.Path(test_src).stem + f".{target}")
    link = [cc, *objs, "-o", str(exe), "-pthread", "-lm", "-ldl"]  # -ldl: sys_linux.c dlopens libdrm
    if target == "aarch64":
        link.insert(1, "-static")
    subprocess.run(link, check=True, capture_output=True, text=True)
    return exe


def cross_tools_missing():
    missing = [t for t in (CROSS_CC, QEMU) if shutil.which(t) is None]
    return missing
