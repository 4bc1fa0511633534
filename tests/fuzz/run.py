"""Run orkpy's fuzz targets, C (libFuzzer + ASan/UBSan/LSan) or Python (atheris,
or the built-in mutator of pyfuzz.py without it), for a given time or number
of executions, and print one line per target: executions, seconds, exec/s,
crashes (crash/leak/timeout/oom artifacts).

    python3 tests/fuzz/run.py --list
    python3 tests/fuzz/run.py o4n1 --seconds 60
    python3 tests/fuzz/run.py tokenizer --runs 100000
    python3 tests/fuzz/run.py --all --seconds 30 [--out results.txt] [--keep DIR]

Each run starts from the stored corpus (tests/fuzz/corpus/<target>/) plus the
seeds generated at run time (the C seed scripts; pytargets.py's seeds, made
from the real files in ../shared when present) in a scratch corpus directory:
the stored corpus is never modified. ``--keep DIR`` keeps the scratch corpus
and the artifacts in DIR/<target>/; without it a crashing input is copied to
./fuzz-artifacts/<target>/. Exit status 1 if any target crashed, hung, leaked
or exited abnormally. Replay an artifact:
``python3 tests/fuzz/run.py TARGET --replay FILE``.
"""
import argparse
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

# C targets: executable (from build.sh), seed module (write_corpus(dir)), dictionary, extra flags
C_TARGETS = {
    "gguf": ("fuzz_gguf", "seeds", "gguf.dict", []),
    "npu_emu": ("fuzz_npu_emu", "seeds_npu", None, ["-max_len=16384"]),
    "o4n1": ("fuzz_o4n1", "seeds_o4n1", None, []),
}
PY_TIMEOUT = 10     # seconds: an input running longer is a hang
RSS_LIMIT_MB = 2048
# atheris (3.0) leaks a reference in its comparison hook when instrumented code compares
# NumPy arrays (``(v < 0).any()``): about 1.7 KB per imatrix_dat execution, not orkpy's memory
# (the same inputs in a plain loop keep a flat RSS). The Python targets get room for 10^6
# executions; a MemoryError still fails them (pyfuzz.py caps the address space).
PY_RSS_LIMIT_MB = 4096


def py_targets():
    import pytargets
    return pytargets.TARGETS


def all_targets():
    return list(C_TARGETS) + list(py_targets())


def env():
    e = dict(os.environ)
    e["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=0:allocator_may_return_null=0"
    e["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1"
    e.setdefault("PYTHONHASHSEED", "0")
    return e


def _source_digest():
    h = hashlib.sha256()
    for p in sorted((ROOT / "csrc" / "ork").rglob("*.[ch]")) + sorted(HERE.glob("*.c")) + [HERE / "build.sh"]:
        h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()[:16]


def build_c(build_dir=None):
    """Build the C targets (cached per source digest); returns the directory."""
    out = pathlib.Path(build_dir or pathlib.Path(tempfile.gettempdir()) / f"orkpy-fuzz-build-{_source_digest()}")
    if all((out / exe).is_file() for exe, *_ in C_TARGETS.values()):
        return out
    cc = os.environ.get("CC") if "clang" in os.environ.get("CC", "") else "clang"
    if shutil.which(cc) is None:
        raise SystemExit(f"{cc} not found: the C fuzz targets need clang and libFuzzer "
                         "(apt-get install clang libclang-rt-14-dev)")
    r = subprocess.run(["bash", str(HERE / "build.sh"), str(out)], capture_output=True, text=True,
                       env=dict(os.environ, CC=cc))
    if r.returncode != 0:
        raise SystemExit(f"building the fuzz targets failed:\n{r.stdout}\n{r.stderr}")
    return out


def write_corpus(name, out):
    """The stored corpus + the run-time seeds of a target into out; returns the count."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if name in C_TARGETS:
        import importlib
        mod = importlib.import_module(C_TARGETS[name][1])
        n = len(mod.write_corpus(out))
        stored = HERE / "corpus" / name
        if stored.is_dir():
            for p in sorted(stored.iterdir()):
                shutil.copyfile(p, out / p.name)
                n += 1
        return n
    import pytargets
    try:
        return pytargets.write_seeds(name, out)
    finally:
        pytargets.cleanup()   # the scratch directory the seed writers used


def command(name, corpus, art, seconds=None, runs=None, seed=None, build_dir=None, files=()):
    """The argv running target name over corpus (a directory) or files (replayed once)."""
    rss = RSS_LIMIT_MB if name in C_TARGETS else PY_RSS_LIMIT_MB
    # Linux carries the parent's peak RSS into the child's ru_maxrss (which libFuzzer checks), so the
    # limit is this process's peak plus the budget; the per-allocation malloc limit is not inherited.
    import resource
    inherited = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    flags = [f"-artifact_prefix={art}/", "-print_final_stats=1", f"-rss_limit_mb={inherited + rss}",
             f"-timeout={PY_TIMEOUT}"]
    if name in C_TARGETS:
        flags.append(f"-malloc_limit_mb={rss}")
    if seconds is not None:
        flags.append(f"-max_total_time={int(seconds)}")
    if runs is not None:
        flags.append(f"-runs={int(runs)}")
    if seed is not None:
        flags.append(f"-seed={int(seed)}")
    inputs = [os.path.abspath(f) for f in files] if files else [str(corpus)]
    if name in C_TARGETS:
        exe, _, dict_file, extra = C_TARGETS[name]
        d = [f"-dict={HERE / dict_file}"] if dict_file else []
        return [str(pathlib.Path(build_dir) / exe), *inputs, *d, *extra, *flags]
    t = py_targets()[name]
    d = [f"-dict={HERE / t.dict_file}"] if t.dict_file and (HERE / t.dict_file).is_file() else []
    return [sys.executable, str(HERE / "pyfuzz.py"), name, *inputs, *d, *flags]


def artifacts(art):
    art = pathlib.Path(art)
    return sorted(p for p in art.iterdir() if p.name.split("-")[0] in ("crash", "leak", "timeout", "oom",
                                                                         "slow_unit")) if art.is_dir() else []


def run_one(name, seconds=None, runs=None, seed=None, build_dir=None, keep=None, files=(), quiet=False):
    """Run one target; returns a dict with the figures and the log."""
    work = pathlib.Path(keep) / name if keep else pathlib.Path(tempfile.mkdtemp(prefix=f"orkpy-fuzz-{name}-"))
    corpus, art, scratch = work / "corpus", work / "artifacts", work / "scratch"
    for d in (corpus, art):
        d.mkdir(parents=True, exist_ok=True)
    n_seeds = write_corpus(name, corpus) if not files else 0
    cmd = command(name, corpus, art, seconds, runs, seed, build_dir, files)
    e = env()
    e["ORKPY_FUZZ_SCRATCH"] = str(scratch)
    e["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), e.get("PYTHONPATH")]))
    t0 = time.monotonic()
    limit = None if seconds is None else seconds + 300
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", cwd=work, env=e, timeout=limit)
        rc, log = r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired as ex:
        def text(x):
            return x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
        rc, log = "killed", text(ex.stdout) + text(ex.stderr) + "\nrun.py: killed after the time limit"
    secs = time.monotonic() - t0
    shutil.rmtree(scratch, ignore_errors=True)
    m = re.search(r"stat::number_of_executed_units:\s*(\d+)", log)
    execs = int(m.group(1)) if m else None
    found = artifacts(art)
    bad = rc != 0 or bool(found) or "ERROR: AddressSanitizer" in log or "runtime error:" in log \
        or "ERROR: LeakSanitizer" in log
    if found and not keep:
        dst = pathlib.Path.cwd() / "fuzz-artifacts" / name
        dst.mkdir(parents=True, exist_ok=True)
        found = [pathlib.Path(shutil.copy(p, dst / p.name)) for p in found]
    res = {"target": name, "kind": "C" if name in C_TARGETS else "py", "execs": execs, "seconds": secs,
           "rate": (execs / secs) if execs and secs > 0 else 0.0, "crashes": len(found), "rc": rc, "bad": bad,
           "artifacts": [str(p) for p in found], "seeds": n_seeds, "log": log, "cmd": cmd}
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    return res


def line(r):
    ex = "?" if r["execs"] is None else f"{r['execs']}"
    status = "ok" if not r["bad"] else f"FAILED (exit {r['rc']}, {r['crashes']} artifact(s): {', '.join(r['artifacts'])})"
    return (f"{r['target']:<13} {r['kind']:<3} executions {ex:>10}  time {r['seconds']:8.1f} s  "
            f"exec/s {r['rate']:9.0f}  crashes/hangs/leaks {r['crashes']}  {status}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target", nargs="?", help="a target name (see --list)")
    ap.add_argument("--all", action="store_true", help="run every target, one after the other")
    ap.add_argument("--list", action="store_true", help="list the targets")
    ap.add_argument("--seconds", type=float, help="time per target (default 60 unless --runs is given)")
    ap.add_argument("--runs", type=int, help="number of executions per target")
    ap.add_argument("--seed", type=int, help="the fuzzer's random seed")
    ap.add_argument("--keep", metavar="DIR", help="keep each target's corpus and artifacts in DIR/<target>/")
    ap.add_argument("--out", metavar="FILE", help="also append the result lines to FILE")
    ap.add_argument("--build-dir", metavar="DIR", help="where the C targets are built (default: a cache in $TMPDIR)")
    ap.add_argument("--replay", metavar="FILE", nargs="+", help="run these inputs once each through the target")
    ap.add_argument("--verbose", action="store_true", help="print the fuzzer's log")
    a = ap.parse_args(argv)
    if a.list:
        for n in C_TARGETS:
            print(f"{n:<13} C   libFuzzer + ASan/UBSan: tests/fuzz/{C_TARGETS[n][0]}.c")
        for n, t in py_targets().items():
            print(f"{n:<13} py  {t.doc}")
        return 0
    names = all_targets() if a.all else [a.target] if a.target else []
    if not names:
        ap.error("give a target, --all or --list")
    unknown = [n for n in names if n not in all_targets()]
    if unknown:
        ap.error(f"unknown target {unknown[0]!r} (see --list)")
    seconds = a.seconds if a.seconds is not None else (None if a.runs is not None or a.replay else 60)
    build_dir = build_c(a.build_dir) if any(n in C_TARGETS for n in names) else None
    failed = 0
    for n in names:
        r = run_one(n, seconds, a.runs, a.seed, build_dir, a.keep, files=a.replay or ())
        if a.verbose or r["bad"]:
            tail = "\n".join(r["log"].splitlines()[-60:])
            print(tail, file=sys.stderr)
        s = line(r)
        print(s, flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(s + "\n")
        failed += r["bad"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
