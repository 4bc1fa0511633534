"""A short coverage-guided libFuzzer run of the GGUF parser + dequantizers under
ASan/UBSan/LSan (tests/fuzz/), and a replay of the crafted corrupt and valid
files through the same instrumented target. Each run is a fixed number of
executions with a fixed seed (-runs, -seed), never a time budget: the work does
not depend on the machine's speed. Longer runs by hand: see tests/fuzz/build.sh."""
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

FUZZ = pathlib.Path(__file__).resolve().parent / "fuzz"
INSTALL_HINT = "apt-get install clang libclang-rt-14-dev (Debian bookworm; .ci/install does it)"
RUNS = {"gguf": 60000, "npu_emu": 15000, "o4n1": 100000}  # executions per short run

pytestmark = pytest.mark.slow  # builds the instrumented targets with clang, then fuzzes


def _env():
    env = dict(os.environ)
    env["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=0:allocator_may_return_null=0"
    env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1"
    return env


def _mem_limits(mb=2048):
    """libFuzzer memory flags that mean `mb` of the fuzzer's own memory.

    libFuzzer's RSS check reads getrusage(RUSAGE_SELF).ru_maxrss, and Linux carries the parent's peak RSS
    into a child across fork/vfork + exec, so a fuzzer started from a pytest process that once held a real
    model (several GiB) would report an "out-of-memory" on its first input. The RSS limit is therefore the
    inherited peak plus `mb`; the malloc limit (checked per allocation, not inherited) stays `mb`, which is
    what catches a header that asks for a huge buffer.
    """
    import resource
    inherited = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    return [f"-rss_limit_mb={inherited + mb}", f"-malloc_limit_mb={mb}"]


def _tail(text, n=60):
    return "\n".join(text.splitlines()[-n:])


@pytest.fixture(scope="module")
def fuzzer(tmp_path_factory):
    """Build tests/fuzz/fuzz_gguf once per module (skip if clang/libFuzzer is missing)."""
    cc = os.environ.get("CC") if "clang" in os.environ.get("CC", "") else "clang"
    if shutil.which(cc) is None:
        pytest.skip(f"{cc} not found: the fuzz target needs package 'clang' ({INSTALL_HINT})")
    out = tmp_path_factory.mktemp("fuzz_build")
    probe = out / "probe.c"
    probe.write_text("#include <stddef.h>\n#include <stdint.h>\n"
                     "int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n")
    r = subprocess.run([cc, "-fsanitize=fuzzer,address,undefined", str(probe), "-o", str(out / "probe")],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"{cc} cannot link -fsanitize=fuzzer (libFuzzer runtime missing: package "
                    f"'libclang-rt-14-dev'; {INSTALL_HINT}): {_tail(r.stderr, 3)}")
    r = subprocess.run(["bash", str(FUZZ / "build.sh"), str(out)], capture_output=True, text=True,
                       env=dict(os.environ, CC=cc))
    assert r.returncode == 0, f"building the fuzz target failed:\n{r.stdout}\n{r.stderr}"
    exe = out / "fuzz_gguf"
    assert exe.is_file()
    return exe


def _seeds_module():
    sys.path.insert(0, str(FUZZ))
    try:
        import seeds
    finally:
        sys.path.remove(str(FUZZ))
    return seeds


def _crashes(tmp_path):
    return sorted(p.name for p in tmp_path.glob("crash-*")) + sorted(p.name for p in tmp_path.glob("leak-*")) + \
        sorted(p.name for p in tmp_path.glob("timeout-*")) + sorted(p.name for p in tmp_path.glob("oom-*"))


def test_fuzz_gguf_short_run(fuzzer, tmp_path):
    corpus = tmp_path / "corpus"
    seeds = _seeds_module()
    written = seeds.write_corpus(corpus)
    assert len(written) >= 30
    cmd = [str(fuzzer), str(corpus), f"-dict={FUZZ / 'gguf.dict'}", "-seed=1", f"-runs={RUNS['gguf']}",
           *_mem_limits(), "-timeout=10", "-print_final_stats=1", f"-artifact_prefix={tmp_path}/"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=_env(), timeout=600)
    log = r.stdout + r.stderr
    assert r.returncode == 0, (f"libFuzzer exited with {r.returncode}; artifacts {_crashes(tmp_path)} "
                               f"(replay: {fuzzer} <artifact>)\n{_tail(log)}")
    assert "ERROR: AddressSanitizer" not in log and "runtime error:" not in log, _tail(log)
    m = re.search(r"stat::number_of_executed_units:\s*(\d+)", log)
    assert m, f"no final stats in the libFuzzer output:\n{_tail(log)}"
    assert int(m.group(1)) >= RUNS["gguf"], _tail(log)
    cov = re.findall(r"cov: (\d+) ft: (\d+)", log)
    assert cov and int(cov[-1][0]) > 100, _tail(log)  # the seeds reach deep into parser and dequantizers


def test_fuzz_target_replays_corrupt_and_crafted_files(fuzzer, tmp_path):
    """Every CORRUPT case of tests/test_gguf.py and every crafted valid seed, run once each
    through the instrumented target: no ASan/UBSan/LSan report, no invariant trap."""
    from test_gguf import CORRUPT  # skips (like test_gguf.py) when the gguf package is missing
    seeds = _seeds_module()
    files = []
    for i, (name, (data, _pattern)) in enumerate(sorted(CORRUPT.items())):
        p = tmp_path / f"corrupt_{i:03d}"
        p.write_bytes(data)
        files.append(p)
    for name, data in sorted(seeds.crafted().items()):
        p = tmp_path / f"crafted_{name}"
        p.write_bytes(data)
        files.append(p)
    r = subprocess.run([str(fuzzer), f"-artifact_prefix={tmp_path}/", *map(str, files)], capture_output=True,
                       text=True, cwd=tmp_path, env=_env(), timeout=120)
    log = r.stdout + r.stderr
    assert r.returncode == 0, f"exit {r.returncode}\n{_tail(log)}"
    assert len(re.findall(r"^Executed .* in \d+ ms", log, re.M)) == len(files), _tail(log)


def test_fuzz_npu_emulator_short_run(fuzzer, tmp_path):
    """The strict emulator over mutated command streams (seeded with orkpy's own
    single tasks and chains): no out-of-bounds access, UB or leak."""
    sys.path.insert(0, str(FUZZ))
    try:
        import seeds_npu
    finally:
        sys.path.remove(str(FUZZ))
    corpus = tmp_path / "corpus"
    assert len(seeds_npu.write_corpus(corpus)) >= 10
    exe = fuzzer.parent / "fuzz_npu_emu"
    cmd = [str(exe), str(corpus), "-seed=1", f"-runs={RUNS['npu_emu']}", *_mem_limits(), "-timeout=10",
           "-max_len=16384", "-print_final_stats=1", f"-artifact_prefix={tmp_path}/"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=_env(), timeout=600)
    log = r.stdout + r.stderr
    assert r.returncode == 0, f"libFuzzer exited with {r.returncode}; artifacts {_crashes(tmp_path)}\n{_tail(log)}"
    assert "ERROR: AddressSanitizer" not in log and "runtime error:" not in log, _tail(log)
    m = re.search(r"stat::number_of_executed_units:\s*(\d+)", log)
    assert m and int(m.group(1)) >= RUNS["npu_emu"], _tail(log)


def test_fuzz_o4n1_short_run(fuzzer, tmp_path):
    """The O4N1/O8N1 parser and the matmul over what it accepts (every ISA this CPU runs
    must give the exact accumulators and the same float bits) over mutated save_packed
    files and the stored corpus: no ASan/UBSan/LSan report, no invariant trap."""
    sys.path.insert(0, str(FUZZ))
    try:
        import seeds_o4n1
    finally:
        sys.path.remove(str(FUZZ))
    corpus = tmp_path / "corpus"
    seeds = seeds_o4n1.write_corpus(corpus)
    stored = sorted((FUZZ / "corpus" / "o4n1").iterdir())
    assert seeds and stored and sum(p.stat().st_size for p in stored) < 20_000
    for p in stored:
        shutil.copyfile(p, corpus / p.name)
    exe = fuzzer.parent / "fuzz_o4n1"
    r = subprocess.run([str(exe), f"-artifact_prefix={tmp_path}/", *map(str, stored + seeds)], capture_output=True,
                       text=True, cwd=tmp_path, env=_env(), timeout=120)
    log = r.stdout + r.stderr
    assert r.returncode == 0, f"replay: exit {r.returncode}\n{_tail(log)}"
    assert len(re.findall(r"^Executed .* in \d+ ms", log, re.M)) == len(stored) + len(seeds), _tail(log)
    cmd = [str(exe), str(corpus), "-seed=1", f"-runs={RUNS['o4n1']}", *_mem_limits(), "-timeout=10",
           "-print_final_stats=1", f"-artifact_prefix={tmp_path}/"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=_env(), timeout=600)
    log = r.stdout + r.stderr
    assert r.returncode == 0, f"libFuzzer exited with {r.returncode}; artifacts {_crashes(tmp_path)}\n{_tail(log)}"
    assert "ERROR: AddressSanitizer" not in log and "runtime error:" not in log, _tail(log)
    assert not _crashes(tmp_path)
