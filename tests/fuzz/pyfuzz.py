"""Run one Python fuzz target of pytargets.py in this process.

    python3 tests/fuzz/pyfuzz.py TARGET [CORPUS_DIR ...] [libFuzzer flags]

With atheris installed (``pip install atheris``) this is a coverage-guided
libFuzzer run over orkpy's instrumented Python code: every libFuzzer flag
applies (-max_total_time, -runs, -timeout, -rss_limit_mb, -dict,
-artifact_prefix, -print_final_stats). ``--engine=builtin`` (the default when
atheris is missing) runs a plain mutation loop instead (bit flips, byte
insertions and deletions, interesting integers, splices between corpus
entries) that understands the same flags (-max_total_time, -runs, -timeout,
-seed, -artifact_prefix, -print_final_stats) and prints the same final
``stat::`` lines; it is not coverage-guided. Either way an input that makes
the target raise anything but its documented exception is written to
``<artifact_prefix>crash-<sha1>`` and the run stops with exit code 1; an input
running longer than -timeout seconds is a hang (``timeout-<sha1>``, exit 70).
Inputs given as files (not directories) are replayed once each.
"""
import hashlib
import os
import pathlib
import random
import resource
import sys
import time
import traceback

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# a tiny input must never need gigabytes: an address-space cap turns a runaway
# allocation into a MemoryError (which no target allows) instead of swapping
AS_LIMIT = 6 << 30


def _limit_memory():
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        lim = AS_LIMIT if hard == resource.RLIM_INFINITY else min(AS_LIMIT, hard)
        resource.setrlimit(resource.RLIMIT_AS, (lim, hard))
    except (ValueError, OSError):
        pass


def _flags(argv):
    opts, paths = {}, []
    for a in argv:
        if a.startswith("-") and "=" in a:
            k, v = a.lstrip("-").split("=", 1)
            opts[k] = v
        else:
            paths.append(a)
    return opts, paths


# ------------------------------------------------------------------ builtin --

_INTERESTING = [0, 1, 2, 7, 8, 15, 16, 31, 32, 63, 64, 127, 128, 255, 256, 1023, 4096, 65535, 65536,
                2**31 - 1, 2**31, 2**32 - 1, 2**63 - 1, 2**64 - 1]


def _mutate(rng, data, pool, max_len):
    b = bytearray(data)
    for _ in range(1 + int(rng.expovariate(0.7))):
        op = rng.randrange(9)
        if op == 0 and b:                                   # flip a bit
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1 and b:                                 # random byte
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif op == 2:                                       # insert bytes
            i = rng.randrange(len(b) + 1)
            b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
        elif op == 3 and b:                                 # delete a run
            i = rng.randrange(len(b))
            del b[i:i + rng.randrange(1, 17)]
        elif op == 4 and len(b) >= 8:                       # interesting integer, 1/2/4/8 bytes LE
            w = rng.choice((1, 2, 4, 8))
            i = rng.randrange(len(b) - w + 1)
            b[i:i + w] = (rng.choice(_INTERESTING) & ((1 << 8 * w) - 1)).to_bytes(w, "little")
        elif op == 5 and b:                                 # duplicate a run
            i = rng.randrange(len(b))
            j = min(len(b), i + rng.randrange(1, 65))
            k = rng.randrange(len(b) + 1)
            b[k:k] = b[i:j]
        elif op == 6 and pool:                              # splice with another input
            o = rng.choice(pool)
            if o:
                i, j = rng.randrange(len(b) + 1), rng.randrange(len(o))
                b = b[:i] + o[j:j + rng.randrange(1, 257)] + b[i:]
        elif op == 7 and b:                                 # ASCII digit / JSON-ish token
            tok = rng.choice((b"0", b"-1", b"1e999", b"NaN", b"[", b"]", b"{", b"}", b'"', b",", b"\t", b"\n",
                              b"x", b"#", b":", b"\x00", b"\xff", b"\xc3\x28", b"true", b"null"))
            i = rng.randrange(len(b) + 1)
            b[i:i] = tok
        elif op == 8 and len(b) > 1:                        # truncate
            del b[rng.randrange(len(b)):]
    return bytes(b[:max_len])


def _artifact(prefix, kind, data):
    p = f"{prefix}{kind}-{hashlib.sha1(data).hexdigest()}"
    with open(p, "wb") as f:
        f.write(data)
    return p


def run_builtin(tgt, opts, paths):
    import faulthandler

    seed = int(opts.get("seed", "0")) or int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    max_time = float(opts.get("max_total_time", "0"))
    runs = int(opts.get("runs", "-1"))
    timeout = float(opts.get("timeout", "10"))
    prefix = opts.get("artifact_prefix", "./")
    dirs = [p for p in paths if os.path.isdir(p)]
    files = [p for p in paths if not os.path.isdir(p)]
    pool = []
    for d in dirs:
        for f in sorted(os.listdir(d)):
            fp = os.path.join(d, f)
            if os.path.isfile(fp):
                pool.append(pathlib.Path(fp).read_bytes())
    max_len = int(opts.get("max_len", "0")) or max([4096] + [len(x) for x in pool])
    print(f"INFO: builtin mutator (atheris not used), seed {seed}, {len(pool)} corpus inputs", file=sys.stderr)
    t0 = time.monotonic()
    n = 0
    slowest = 0.0

    def one(data):
        nonlocal n, slowest
        faulthandler.dump_traceback_later(timeout, exit=True)   # a hang kills the process (exit 1)
        t = time.monotonic()
        try:
            tgt(data)
        except BaseException:
            faulthandler.cancel_dump_traceback_later()
            if isinstance(sys.exc_info()[1], KeyboardInterrupt):
                raise
            print("=== Uncaught Python exception: ===", file=sys.stderr)
            traceback.print_exc()
            print(f"==ERROR: target {tgt.name} raised; artifact {_artifact(prefix, 'crash', data)}",
                  file=sys.stderr)
            _stats(n + 1, time.monotonic() - t0, opts)
            sys.exit(1)
        faulthandler.cancel_dump_traceback_later()
        slowest = max(slowest, time.monotonic() - t)
        n += 1

    if files:
        for f in files:
            one(pathlib.Path(f).read_bytes())
        print(f"Executed {len(files)} inputs", file=sys.stderr)
        _stats(n, time.monotonic() - t0, opts)
        return 0
    for data in pool or [b""]:          # replay the corpus first, as libFuzzer does
        one(data)
    pool = pool or [b""]
    while True:
        if runs >= 0 and n >= runs:
            break
        if max_time and time.monotonic() - t0 >= max_time:
            break
        if not max_time and runs < 0 and n >= 100000:
            break
        one(_mutate(rng, rng.choice(pool), pool, max_len))
    _stats(n, time.monotonic() - t0, opts)
    return 0


def _stats(n, secs, opts):
    print(f"Done {n} runs in {int(secs)} second(s)", file=sys.stderr)
    if opts.get("print_final_stats") == "1":
        print(f"stat::number_of_executed_units: {n}", file=sys.stderr)
        print(f"stat::average_exec_per_sec:     {int(n / secs) if secs > 0 else n}", file=sys.stderr)
    sys.stderr.flush()


# ------------------------------------------------------------------ atheris --

def run_atheris(name, argv):
    import atheris

    with atheris.instrument_imports(include=["orkpy"]):
        import orkpy  # noqa: F401  (instrumented: coverage feedback from orkpy's Python code)
        import orkpy.quantization.calibrate, orkpy.quantization.imatrix, orkpy.runtime.npu, orkpy.formats.safetensors, orkpy.formats.tiermap, orkpy.runtime.tokenizer  # noqa
    import pytargets

    tgt = pytargets.TARGETS[name]
    atheris.Setup([sys.argv[0]] + argv, tgt)
    atheris.Fuzz()


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 2
    name, rest = argv[0], argv[1:]
    engine = None
    for a in list(rest):
        if a.startswith("--engine="):
            engine = a.split("=", 1)[1]
            rest.remove(a)
    _limit_memory()
    if engine is None:
        try:
            import atheris  # noqa: F401
            engine = "atheris"
        except ImportError:
            engine = "builtin"
    import pytargets
    if name not in pytargets.TARGETS:
        print(f"unknown target {name!r}; targets: {', '.join(pytargets.TARGETS)}", file=sys.stderr)
        return 2
    try:
        if engine == "atheris":
            run_atheris(name, rest)
            return 0
        opts, paths = _flags(rest)
        return run_builtin(pytargets.TARGETS[name], opts, paths)
    finally:
        pytargets.cleanup()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
