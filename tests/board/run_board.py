#!/usr/bin/env python3
"""Board check for orkpy's RK3588 NPU layer: the golden int8 x int8 -> int32
matmuls on each device backend (rknpu, rocket), on the strict emulator (emu)
and in NumPy, compared bit for bit; fixtures saved for later comparison.

    python tests/board/run_board.py [--backend {rknpu,rocket,all}] [--out DIR]
                                    [--quick] [--fake] [--allow-missing]
                                    [--int4 {first,only,skip}] [--model {run,skip}]
                                    [--quantize {run,skip,only}]
                                    [--quantize-model {auto,stories260K,synthetic}]

FIRST, before any int8 shape, the int4 step (--int4 first, the default): the
int4 x int4 -> int16 task's register values that no public source gives (one
table, csrc/ork/npu/regcmd.c; orkpy.runtime.npu.int4_register_facts(); the
table "int4 register values" of docs/npu.md) are printed, and the int4 golden
shapes (codes in [-8, 7], rows and columns of -8 / 7 included; K tiles of at
most 480 codes whose int16 blocks the host sums in int32) run on emu and every
device backend against the CPU model (NumPy int64 a @ b.T). Until this step
passes on a board, the int4 path is not trusted: a mismatch fails the run
(exit 1) and names the unverified values; its fixtures (int4_<M>x<K>x<N>.json,
.regcmd.bin) hold what is needed to find the right ones. --int4 only runs
just that step, --int4 skip leaves it out.

For every shape (seeded random int8 operands over the full range -128..127):
  - NumPy reference (float64 matmul, exact here: |sums| <= 128*128*8192 < 2**53),
  - emu and every device backend: weights uploaded once, --calls activations
    run against them (the table shows the best call's ms); each output must
    equal the reference exactly, and the devices' outputs must equal emu's,
  - the fixture's command buffer (plan_commands at fixed addresses, written to
    <name>.regcmd.bin too) is run through orkpy.runtime.npu.emulate on the packed
    operands and must give the reference as well.

Fixtures: <out>/<name>.json per shape and <out>/board-run.json (environment,
device info, summary), each written atomically (temporary file + os.replace).

--fake runs rknpu and rocket against orkpy's fake kernels (executed by the
emulator), so the script runs on any machine; that is how CI tests it. The
fake kernels are test machinery outside the shipped extension: --fake-lib
names the library (default $ORKPY_FAKE_KERNEL_LIB), else it is built here
with gcc from tests/npu_fake (tests/cbuild.py build_fake_kernel).

The model step (--model run, the default; after the int8 shapes): a small model
(the recipe step's, below) whose linears take turns at the packed kinds whose
host side orkpy adds around the NPU's modes -- w4a4 (int4 rows; its int8 sink
row as two int4 digit rows), w4a8 (int8 activations as two int4 digit rows),
w4a8 with group-wise scales (one int4 K tile per group of 32), int8 with
group-wise scales (one int32 block per group of 64) and int8 -- routed to emu and
every device backend (orkpy.runtime.npu.use_npu); its logits at prefill (64
positions) and at decode (one) must equal the CPU path's bit for bit.

The recipe step (--quantize run, the default; after the NPU shapes): orkpy's
quantization recipe QUANT_RECIPE (a Hadamard rotation, GPTQ, static
activation ranges calibrated on 4 chunks of 128 tokens; docs/recipes.md) run
by `orkpy quantize` in a child process on a small model: stories260K from the
project's shared folder (../shared, or $ORKPY_SHARED) when present, else the
seeded synthetic model of `orkpy gate` (orkpy.evaluation.synthetic), or the
one --quantize-model names. It reports the child's wall time, CPU time and
peak resident memory (VmHWM, which the child reads at its end: ru_maxrss
would count this script's memory too) and checks that the model directory
records the recipe and its activation ranges; the child's
output goes to <out>/quantize.log, the model directory is removed. --quantize
only runs just this step (no NPU device needed), --quantize skip (or --int4
only) leaves it out.

Exit status: 0 all equal and the recipe step clean; 1 a mismatch or an
error; 2 no requested device backend can be opened (0 instead with
--allow-missing; nothing is run then).
"""
import argparse
import datetime
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

import orkpy
import orkpy.runtime.npu as npu

DEVICE_BACKENDS = ("rknpu", "rocket")

# (M, K, N, max_n): the golden shapes. Single tasks from mtx512's test suite and the vendor
# int8 capture (4x32x32, tests/test_npu_regcmd.py), then PC-chained multi-task plans (M split,
# N split forced by max_n, M split with a short last tile).
GOLDEN = [
    (1, 4096, 4096, 0),
    (4, 64, 32, 0),
    (4, 32, 32, 0),
    (544, 544, 4096, 0),
    (64, 8192, 8192, 0),
    (1, 8192, 8192, 1024),
    (544, 4096, 512, 0),
]
QUICK_MACS = 1 << 27  # --quick: shapes with at most this many MACs
# (M, K, N) of the int4 step: one task, K = 480 (the largest tile), K = 481 (two tiles, one of 32 codes
# padded), a chain of 5 K tiles with M = 37 and N not a multiple of 64
INT4_GOLDEN = [(4, 64, 64), (1, 480, 64), (4, 481, 128), (37, 2048, 100)]

# the recipe step: rotation + GPTQ + static activation ranges (docs/recipes.md), small enough for any board
QUANT_RECIPE = {"transform": {"rotate": "hadamard"}, "calibration": {"ctx": 128, "chunks": 4},
                "rounding": {"method": "gptq"}, "activation": {"mode": "static"}}
QUANT_CALIB_BYTES = 65536  # stories260K's calibration text: the first whole lines of this many bytes

# the model step: (kind, group size) of linear i is MODEL_KINDS[i % len(MODEL_KINDS)] (module doc)
MODEL_KINDS = (("w4a4", 0), ("w4a8", 0), ("w4a8", 32), ("int8", 64), ("int8", 0))
MODEL_TOKENS = 64

# fixed NPU addresses for the fixture's command buffer (in/w/out as in npu/golden-matmul-regcmd.txt)
FIXED = {"cmd": 0x00100000, "in": 0x10000000, "w": 0x20000000, "out": 0x30000000}


def shape_name(M, K, N, max_n):
    return f"int8_{M}x{K}x{N}" + (f"_maxn{max_n}" if max_n else "")


def sha256(x):
    return hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()


def out_sha256(c):
    """SHA-256 of an int32 (M, N) result as little-endian C-order bytes."""
    return sha256(np.ascontiguousarray(c, dtype="<i4"))


def write_atomic(path, data):
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=d)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; give the usual permissions
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json(path, obj):
    write_atomic(path, (json.dumps(obj, indent=1, sort_keys=False) + "\n").encode())


def inputs(seed, M, K, N, calls):
    """Activations [a_0 .. a_{calls-1}] (M, K) and weights b (N, K), int8, from one generator."""
    rng = np.random.default_rng(seed)
    b = rng.integers(-128, 128, (N, K), dtype=np.int8)
    a = [rng.integers(-128, 128, (M, K), dtype=np.int8) for _ in range(calls)]
    return a, b


def reference(a, b, chunk=1024):
    """int32 a @ b.T via float64 (exact for these magnitudes), in N chunks to bound memory."""
    af = a.astype(np.float64)
    out = np.empty((a.shape[0], b.shape[0]), np.int32)
    for n0 in range(0, b.shape[0], chunk):
        r = af @ b[n0:n0 + chunk].astype(np.float64).T
        assert np.abs(r).max(initial=0) < 2**31
        out[:, n0:n0 + chunk] = r.astype(np.int32)
    return out


def int4_inputs(seed, M, K, N, calls):
    """int4 codes in [-8, 7] as int8 arrays (activations [a_i] (M, K), weights b (N, K)), with the extreme
    products in every call: a row of -8 and a row of 7, a weight row of -8 and one of 7."""
    rng = np.random.default_rng(seed)
    b = rng.integers(-8, 8, (N, K), dtype=np.int8)
    b[0], b[-1] = -8, 7
    a = [rng.integers(-8, 8, (M, K), dtype=np.int8) for _ in range(calls)]
    for x in a:
        x[0], x[-1] = -8, 7
    return a, b


def emulate_fixture(cmd, a, b, M, K, N, max_n, p, precision="int8"):
    """Run the fixture's command buffer through the strict emulator on packed a, b."""
    cb = np.ascontiguousarray(cmd).view(np.uint8).copy()
    pa = np.array(npu.layout("pack_input", M, K, N, a, max_n=max_n, precision=precision), dtype=np.uint8)
    pb = np.array(npu.layout("pack_weights", M, K, N, b, max_n=max_n, precision=precision), dtype=np.uint8)
    out = np.zeros(p["out_bytes"], np.uint8)
    npu.emulate([(FIXED["cmd"], cb), (FIXED["in"], pa), (FIXED["w"], pb), (FIXED["out"], out)], FIXED["cmd"],
                npu.pc_amount(104), p["n_tasks"])
    return npu.layout("unpack_output", M, K, N, out, max_n=max_n, precision=precision)


def device_info(dev):
    info = dict(dev.info())
    fk = info.get("fake_kernel")
    if isinstance(fk, dict):
        info["fake_kernel"] = {k: v for k, v in fk.items() if k != "trace"}
    return info


def fake_tasks(dev):
    fk = dev.info().get("fake_kernel")
    return fk.get("tasks") if isinstance(fk, dict) else None


def run_backend(label, dev, a_list, b, max_n, refs, timeout_note, precision="int8"):
    """Upload b once, run every activation; a result dict."""
    r = {"label": label, "calls": []}
    try:
        t0 = time.perf_counter()
        w = dev.upload(b, max_n=max_n, precision=precision)
        r["upload_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
        r["w_addr"] = f"0x{w.npu_address:08x}"
        info0 = dev.info()
        fk0 = fake_tasks(dev)
        for i, (a, ref) in enumerate(zip(a_list, refs)):
            t0 = time.perf_counter()
            c = dev.matmul(a, w)
            ms = (time.perf_counter() - t0) * 1e3
            ok = c.dtype == np.int32 and c.shape == ref.shape and np.array_equal(c, ref)
            call = {"ms": round(ms, 3), "sha256": out_sha256(c), "equal_reference": bool(ok)}
            if not ok and c.shape == ref.shape:
                bad = np.argwhere(c != ref)
                call["n_diff"] = int(len(bad))
                if len(bad):
                    m, n = (int(x) for x in bad[0])
                    call["first_diff"] = {"m": m, "n": n, "got": int(c[m, n]), "want": int(ref[m, n])}
            elif not ok:
                call["got_shape"], call["got_dtype"] = list(c.shape), str(c.dtype)
            r["calls"].append(call)
        info1 = dev.info()
        r["submits"] = info1["submits"] - info0["submits"]
        r["tasks"] = info1["tasks"] - info0["tasks"]
        fk1 = fake_tasks(dev)
        if fk0 is not None and fk1 is not None:
            r["fake_kernel_tasks"] = fk1 - fk0
        del w
    except Exception as e:  # a device failure is a result, not a crash: finish the table
        r["error"] = f"{type(e).__name__}: {e}{timeout_note if isinstance(e, npu.NPUTimeoutError) else ''}"
    r["ok"] = "error" not in r and len(r["calls"]) == len(refs) and all(c["equal_reference"] for c in r["calls"])
    return r


def run_int4(args, devs, labels):
    """The int4 step (module doc): the unverified register table printed, every INT4_GOLDEN shape on emu
    and each device against the CPU model, fixtures written. Returns (ok, per-shape summary, files)."""
    facts = npu.int4_register_facts()
    print("int4 x int4 -> int16 FIRST: the register values no public source gives (csrc/ork/npu/regcmd.c; "
          "docs/npu.md 'int4 register values') -- the int4 path is trusted only once this step passes on a board:")
    for f in facts:
        val = f["value"] if f["value"] is not None else f["formula"]
        print(f"  {f['register'] + '.' + f['field']:<50} = {val!s:<28} "
              f"{'unverified' if 'unverified' in f['basis'] else 'public'}")
    summary, written, all_ok = [], [], True
    for idx, (M, K, N) in enumerate(INT4_GOLDEN):
        name = f"int4_{M}x{K}x{N}"
        seed = args.seed + 1000 + idx
        p = npu.plan(M, K, N, precision="int4")
        a_list, b = int4_inputs(seed, M, K, N, args.calls)
        refs = [(x.astype(np.int64) @ b.astype(np.int64).T).astype(np.int32) for x in a_list]  # the CPU model
        cmd = np.asarray(npu.plan_commands(M, K, N, FIXED["cmd"], FIXED["in"], FIXED["w"], FIXED["out"],
                                           precision="int4"), dtype=np.uint64)
        try:
            fixture_ok, fixture_err = bool(np.array_equal(emulate_fixture(cmd, a_list[0], b, M, K, N, 0, p, "int4"),
                                                          refs[0])), None
        except Exception as e:
            fixture_ok, fixture_err = False, f"{type(e).__name__}: {e}"
        results = {be: run_backend(labels[be], dev, a_list, b, 0, refs, f" (--timeout-ms {args.timeout_ms})", "int4")
                   for be, dev in devs.items()}
        ok = fixture_ok and all(r["ok"] for r in results.values())
        for i, (be, r) in enumerate(results.items()):
            col = f"{name:<26}{p['n_tasks']:>6}" if i == 0 else f"{'':<26}{'':>6}"
            state = ("ERROR " + r["error"]) if "error" in r else ("ok" if r["ok"] else "MISMATCH vs the CPU model")
            print(f"{col}  {r['label']:<14}{state}")
            for j, c in enumerate(r["calls"]):
                if not c["equal_reference"]:
                    print(f"{'':<34}call {j}: {json.dumps({k: v for k, v in c.items() if k != 'sha256'})}")
        print(f"{'':<34}{'fixture cmds':<14}{'ok' if fixture_ok else 'MISMATCH ' + (fixture_err or '')}")
        fixture = {"name": name, "precision": "int4", "M": M, "K": K, "N": N, "seed": seed,
                   "inputs": "int4_inputs(seed, M, K, N, calls): codes in [-8, 7] with -8 / 7 rows",
                   "a_sha256": [sha256(x) for x in a_list], "b_sha256": sha256(b),
                   "plan": {k: v for k, v in p.items() if k != "tasks"}, "tasks": p["tasks"],
                   "unverified_registers": facts,
                   "commands": {"addresses": {k: f"0x{v:08x}" for k, v in FIXED.items()},
                                "qwords": [f"{int(q):016x}" for q in cmd], "sha256": sha256(cmd.astype("<u8")),
                                "bin": name + ".regcmd.bin", "emulated_equal_reference": fixture_ok,
                                **({"emulate_error": fixture_err} if fixture_err else {})},
                   "output": "int32 (M, N) = the int16 K-tile blocks summed on the host, SHA-256 of its bytes",
                   "reference_sha256": [out_sha256(r) for r in refs],
                   "results": {be: {**{k: v for k, v in r.items() if k != "label"},
                                    "fake": bool(args.fake and be != "emu")} for be, r in results.items()},
                   "ok": ok}
        write_atomic(os.path.join(args.out, name + ".regcmd.bin"), cmd.astype("<u8").tobytes())
        write_json(os.path.join(args.out, name + ".json"), fixture)
        written += [name + ".json", name + ".regcmd.bin"]
        summary.append({"name": name, "n_tasks": p["n_tasks"], "ok": ok})
        all_ok = all_ok and ok
    if not all_ok:
        print("int4 NOT CONFIRMED: at least one int4 shape differs from the CPU model; the unverified register "
              "values above (docs/npu.md) do not all hold on this board -- the int4 path must not be used")
    print()
    return all_ok, summary, written


def shared_models():
    """The shared folder's stories260K directory ($ORKPY_SHARED, else ../shared beside the project), or None."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    shared = os.environ.get("ORKPY_SHARED") or os.path.join(os.path.dirname(root), "shared")
    d = os.path.join(shared, "models", "stories260K")
    return d if os.path.isfile(os.path.join(d, "stories260K-F16.gguf")) else None


def quantize_inputs(which, tmp):
    """(model name, source, allocation, calibration text) of the recipe step: stories260K (its F16 GGUF, the
    Q4_0 file's allocation, the first lines of tinystories-val-B.txt) or the synthetic model written to tmp."""
    st = shared_models() if which in ("auto", "stories260K") else None
    if st is not None:
        with open(os.path.join(st, "..", "..", "text", "tinystories-val-B.txt"), "rb") as f:
            text = f.read(QUANT_CALIB_BYTES)
        calib = os.path.join(tmp, "calib.txt")
        with open(calib, "wb") as f:
            f.write(text[:text.rfind(b"\n") + 1])
        return "stories260K", os.path.join(st, "stories260K-F16.gguf"), os.path.join(st, "stories260K-Q4_0.gguf"), calib
    if which == "stories260K":
        raise FileNotFoundError("stories260K not found: no shared folder (set ORKPY_SHARED)")
    from orkpy.evaluation.synthetic import make_synthetic
    paths = make_synthetic(os.path.join(tmp, "synthetic"))
    return "synthetic", paths["model"], paths["alloc"], paths["calib"]


# The recipe step's child: orkpy's command line (python -m orkpy), then its own peak resident memory written to
# argv[1]: VmHWM, the high-water mark of this process's memory since its exec. Not ru_maxrss: Linux carries the
# parent's high-water mark across fork and exec into the child's (a child of a 1 GB parent reports >= 1 GB).
CHILD = """import runpy, sys
report = sys.argv.pop(1)
try:
    runpy.run_module("orkpy", run_name="__main__", alter_sys=True)
finally:
    with open("/proc/self/status") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    with open(report, "w") as f:
        f.write(str(kib * 1024))
"""


def run_child(args, log_path, env=None):
    """`python -m orkpy *args` with stdout and stderr to log_path: (exit code, wall seconds, CPU seconds, the
    child's peak RSS in bytes or None when it wrote none, e.g. killed)."""
    fd, report = tempfile.mkstemp(prefix="orkpy-board-peak-")
    os.close(fd)
    try:
        with open(log_path, "wb") as log:
            t0 = time.perf_counter()
            p = subprocess.Popen([sys.executable, "-c", CHILD, report, *args], stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=subprocess.STDOUT, env=env)
            try:
                _, status, ru = os.wait4(p.pid, 0)
            except BaseException:
                p.kill()
                p.wait()
                raise
            wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
        with open(report) as f:
            peak = f.read().strip()
        return p.returncode, wall, ru.ru_utime + ru.ru_stime, int(peak) if peak else None
    finally:
        os.unlink(report)


def run_quantize(args):
    """The recipe step (module doc): QUANT_RECIPE by `orkpy quantize` in a child process; a result dict."""
    r = {"recipe": QUANT_RECIPE, "cpus": os.cpu_count(), "log": "quantize.log"}
    tmp = tempfile.mkdtemp(prefix="orkpy-board-quantize-")
    try:
        name, src, alloc, calib = quantize_inputs(args.quantize_model, tmp)
        r.update(model=name, source=os.path.basename(src), alloc=os.path.basename(alloc))
        recipe, out = os.path.join(tmp, "recipe.json"), os.path.join(tmp, "model")
        write_json(recipe, QUANT_RECIPE)
        env = dict(os.environ)  # the child imports the orkpy this script runs
        root = os.path.dirname(os.path.dirname(os.path.abspath(orkpy.__file__)))
        env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        code, wall, cpu, rss = run_child(["quantize", src, "--alloc", alloc, "--calib", calib, "--recipe", recipe,
                                          "-o", out, "--no-progress"], os.path.join(args.out, "quantize.log"), env)
        r.update(exit_code=code, wall_s=round(wall, 3), cpu_s=round(cpu, 3), peak_rss_bytes=rss)
        if code != 0:
            r["error"] = f"orkpy quantize exited with status {code} (see quantize.log)"
        elif rss is None:
            r["error"] = "the child reported no peak memory"
        else:
            with open(os.path.join(out, "manifest.json")) as f:
                manifest = json.load(f)
            r["linears"] = len(manifest["tensors"])
            r["model_bytes"] = sum(e.stat().st_size for e in os.scandir(out) if e.is_file())
            if orkpy.Recipe.load(out) != orkpy.Recipe.from_dict(QUANT_RECIPE):
                r["error"] = "the model directory records another recipe"
            elif not manifest.get("act_scales"):
                r["error"] = "the model directory has no static activation ranges"
    except Exception as e:
        r["error"] = f"{type(e).__name__}: {e}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    r["ok"] = "error" not in r
    keys = ", ".join(f"{sec}.{k}={v}" for sec, d in QUANT_RECIPE.items() for k, v in d.items())
    print(f"quantize: orkpy quantize {r.get('model', '?')}, recipe {keys}")
    line = f"{'':<10}"
    if "wall_s" in r:
        line += f"wall {r['wall_s']:.2f} s  cpu {r['cpu_s']:.2f} s  "
    if r.get("peak_rss_bytes"):
        line += f"peak RSS {r['peak_rss_bytes'] / 2**20:.1f} MiB  "
    print(line + (f"ok: {r['linears']} linears, {r['model_bytes']:,} bytes" if r["ok"] else "ERROR " + r["error"]))
    return r


def run_model(args, devs, labels):
    """The model step (module doc): a result dict, "ok" when every backend's logits equal the CPU path's."""
    from orkpy.formats.source import open_source
    from orkpy.kernels.actspec import ActSpec
    from orkpy.kernels.packed import pack
    from orkpy.kernels.quant import quantize
    from orkpy.runtime.actcal import resolve
    from orkpy.runtime.model import LinearSpec, build_model, linear_names

    out = {"ok": False}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            name, path, _, _ = quantize_inputs(args.quantize_model, tmp)
            src = open_source(path)
            order = {n: i for i, n in enumerate(linear_names(src.hp))}

            def spec(n):
                kind, g = MODEL_KINDS[order[n] % len(MODEL_KINDS)]
                pw = pack(quantize(src.linear(n), kind, group_size=g or None))
                tier = f"{kind}-g{pw.group}" if pw.group else kind
                return LinearSpec.from_packed(n, pw, act_spec=resolve(ActSpec(), n, None, pw.K, "board", kind, pw.group)), tier
            m = build_model(src, spec)
            toks = (np.arange(1, MODEL_TOKENS + 1) * 37) % int(src.hp["n_vocab"])
            want = {"prefill": m.forward(toks), "decode": m.forward(toks[:1])}
        except Exception as e:
            out["error"] = f"{type(e).__name__}: {e}"
            print(f"{'model step':<26}{'':>6}  {'':<14}{'':>22}  ERROR {out['error']}")
            return out
        kinds = sorted({f"{s.kind}-g{s.group}" if s.group else s.kind for s in m.linears.values()})
        out.update({"model": name, "linears": len(m.linears), "kinds": kinds, "tokens": MODEL_TOKENS,
                    "cpu_sha256": {k: out_sha256(v) for k, v in want.items()}, "results": {}})
        print(f"model step: {name}, {len(m.linears)} linears at {', '.join(kinds)}; logits at prefill "
              f"({MODEL_TOKENS}) and decode (1) vs the CPU path")
        ok = True
        for be, dev in devs.items():
            r = {}
            try:
                t0 = time.perf_counter()
                r["routed"] = npu.use_npu(m, dev)
                got = {"prefill": m.forward(toks), "decode": m.forward(toks[:1])}
                r["ms"] = 1e3 * (time.perf_counter() - t0)
                r["equal"] = {k: bool(np.array_equal(got[k], want[k])) for k in want}
                r["ok"] = all(r["equal"].values())
            except Exception as e:
                r.update(ok=False, error=f"{type(e).__name__}: {e}")
            finally:
                npu.use_npu(m, None)
            ok = ok and r["ok"]
            out["results"][be] = r
            verdict = ("ERROR " + r["error"]) if "error" in r else ("ok" if r["ok"] else "MISMATCH " + json.dumps(r["equal"]))
            print(f"{'model ' + name:<26}{r.get('routed', 0):>6}  {labels[be]:<14}{r.get('ms', 0.0):>11.2f}{'':>11}  "
                  f"{verdict}")
        out["ok"] = ok
    return out


def environment(argv):
    """The run's environment for board-run.json."""
    return {"tool": "tests/board/run_board.py", "argv": sys.argv[1:] if argv is None else list(argv),
            "utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "orkpy": getattr(orkpy, "__version__", None), "numpy": np.__version__,
            "python": platform.python_version(), "uname": list(platform.uname())}


def build_fake_kernel():
    """The fake kernel library built from tests/npu_fake (tests/cbuild.py) into a temporary directory."""
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, tests)
    try:
        from cbuild import build_fake_kernel as build
    finally:
        sys.path.remove(tests)
    return build(tempfile.mkdtemp(prefix="orkpy-fake-npu-"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=("rknpu", "rocket", "all"), default="all",
                    help="device backend(s) to check (all: every one this machine has)")
    ap.add_argument("--out", default="npu-board-fixtures", help="fixture directory (created)")
    ap.add_argument("--fake", action="store_true", help="run rknpu/rocket against orkpy's fake kernels")
    ap.add_argument("--fake-lib", default=os.environ.get("ORKPY_FAKE_KERNEL_LIB"),
                    help="the fake kernel library for --fake (default $ORKPY_FAKE_KERNEL_LIB; else built from "
                         "tests/npu_fake)")
    ap.add_argument("--quick", action="store_true", help=f"only the small shapes (<= {QUICK_MACS} MACs)")
    ap.add_argument("--allow-missing", action="store_true",
                    help="exit 0 (running nothing) when no requested device backend is present")
    ap.add_argument("--seed", type=int, default=20240601, help="base seed; shape i uses seed + i")
    ap.add_argument("--calls", type=int, default=2, help="activations run per uploaded weight")
    ap.add_argument("--timeout-ms", type=int, default=10000)
    ap.add_argument("--int4", choices=("first", "only", "skip"), default="first",
                    help="the int4 step (unverified register values): first (default), only, or skip")
    ap.add_argument("--model", choices=("run", "skip"), default="run",
                    help="the model step (w4a4 / w4a8 / grouped linears through every backend, logits vs the CPU "
                         "path) after the int8 shapes (default: run)")
    ap.add_argument("--quantize", choices=("run", "skip", "only"), default="run",
                    help="the recipe step on a small model (CPU; time and peak memory): run after the NPU shapes "
                         "(default), skip, or only (no NPU device needed)")
    ap.add_argument("--quantize-model", choices=("auto", "stories260K", "synthetic"), default="auto",
                    help="the recipe step's model (auto: stories260K when ../shared has it, else the synthetic one)")
    args = ap.parse_args(argv)
    if args.calls < 1:
        ap.error("--calls must be >= 1")
    if args.quantize == "only":
        os.makedirs(args.out, exist_ok=True)
        print(f"orkpy {getattr(orkpy, '__version__', '?')} board check: the recipe step only; out {args.out}")
        q = run_quantize(args)
        write_json(os.path.join(args.out, "board-run.json"),
                   {**environment(argv), "mode": "quantize only", "quantize": q, "ok": q["ok"]})
        print(f"{'ALL OK' if q['ok'] else 'FAILED: quantize'}; report in {args.out}")
        return 0 if q["ok"] else 1

    wanted = list(DEVICE_BACKENDS) if args.backend == "all" else [args.backend]
    missing = npu.unavailable()
    if args.fake:
        npu.load_fake_kernel(args.fake_lib or build_fake_kernel())
        backends, skipped = wanted, {}
    else:
        backends = [b for b in wanted if b not in missing]
        skipped = {b: missing[b] for b in wanted if b in missing}
    for b, why in skipped.items():
        print(f"{b}: unavailable: {why}", file=sys.stderr if not backends else sys.stdout)
    if not backends:
        print(f"no NPU device backend to check ({', '.join(wanted)}); nothing was run. "
              f"Use --fake to exercise the fake kernels, or --allow-missing to exit 0.", file=sys.stderr)
        return 0 if args.allow_missing else 2

    shapes = [(i, s) for i, s in enumerate(GOLDEN) if (not args.quick or s[0] * s[1] * s[2] <= QUICK_MACS)
              and args.int4 != "only"]
    os.makedirs(args.out, exist_ok=True)
    mode = "fake kernel" if args.fake else "device"
    devs = {"emu": npu.Device("emu", timeout_ms=args.timeout_ms)}
    open_errors = {}
    for b in backends:
        try:
            devs[b] = npu.Device(b, fake_kernel=b if args.fake else None, timeout_ms=args.timeout_ms)
        except Exception as e:
            open_errors[b] = f"{type(e).__name__}: {e}"
    labels = {b: b + ("(fake)" if args.fake and b != "emu" else "") for b in ["emu"] + backends}

    n4 = 0 if args.int4 == "skip" else len(INT4_GOLDEN)
    print(f"orkpy {getattr(orkpy, '__version__', '?')} NPU board check: {', '.join(backends)} ({mode}) vs emu vs "
          f"NumPy (float64); {n4} int4 shape(s) first, then {len(shapes)} int8 shape(s), {args.calls} call(s) each, "
          f"seed {args.seed}; out {args.out}")
    for b, e in open_errors.items():
        print(f"{'(open)':<26}{'':>6}  {labels[b]:<14}{'':>22}  ERROR {e}")
    hdr = (f"{'shape':<26}{'tasks':>6}  {'backend':<14}{'upload ms':>11}{'matmul ms':>11}  {'vs numpy':<9}"
           f"{'vs emu':<8}{'sha256':<14}")

    all_ok = not open_errors
    summary = []
    written = []
    int4_ok, int4_summary = True, []
    if n4:
        int4_ok, int4_summary, written = run_int4(args, devs, labels)
        all_ok = all_ok and int4_ok
    print(hdr)
    print("-" * len(hdr))
    for idx, (M, K, N, max_n) in shapes:
        name = shape_name(M, K, N, max_n)
        seed = args.seed + idx
        p = npu.plan(M, K, N, max_n=max_n)
        a_list, b = inputs(seed, M, K, N, args.calls)
        refs = [reference(a, b) for a in a_list]
        ref_sha = [out_sha256(r) for r in refs]
        cmd = np.asarray(npu.plan_commands(M, K, N, FIXED["cmd"], FIXED["in"], FIXED["w"], FIXED["out"],
                                           max_n=max_n), dtype=np.uint64)
        try:
            emu_fix = emulate_fixture(cmd, a_list[0], b, M, K, N, max_n, p)
            fixture_ok = bool(np.array_equal(emu_fix, refs[0]))
            fixture_err = None
        except Exception as e:
            fixture_ok, fixture_err = False, f"{type(e).__name__}: {e}"

        results = {}
        for be, dev in devs.items():
            results[be] = run_backend(labels[be], dev, a_list, b, max_n, refs,
                                      f" (--timeout-ms {args.timeout_ms})")
        emu_sha = [c["sha256"] for c in results["emu"]["calls"]]
        shape_ok = fixture_ok
        first = True
        for be, r in results.items():
            vs_emu = "-" if be == "emu" else ("ok" if [c["sha256"] for c in r["calls"]] == emu_sha
                                              and results["emu"]["ok"] and r["ok"] else "DIFF")
            r["equal_emu"] = None if be == "emu" else vs_emu == "ok"
            shape_ok = shape_ok and r["ok"] and vs_emu != "DIFF"
            col = f"{name:<26}{p['n_tasks']:>6}" if first else f"{'':<26}{'':>6}"
            first = False
            if "error" in r:
                print(f"{col}  {r['label']:<14}{'':>22}  ERROR {r['error']}")
                continue
            ms = min(c["ms"] for c in r["calls"])
            vs_np = "ok" if r["ok"] else "MISMATCH"
            print(f"{col}  {r['label']:<14}{r['upload_ms']:>11.2f}{ms:>11.2f}  {vs_np:<9}{vs_emu:<8}"
                  f"{r['calls'][0]['sha256'][:12]:<14}")
            for i, c in enumerate(r["calls"]):
                if not c["equal_reference"]:
                    print(f"{'':<34}call {i}: {json.dumps({k: v for k, v in c.items() if k != 'sha256'})}")
        print(f"{'':<34}{'fixture cmds':<14}{'':>22}  "
              f"{('ok' if fixture_ok else 'MISMATCH' + (' ' + fixture_err if fixture_err else '')):<9}"
              f"{'(emulate() of the saved command buffer)'}")
        all_ok = all_ok and shape_ok

        fixture = {
            "name": name, "M": M, "K": K, "N": N, "max_m": 0, "max_k": 0, "max_n": max_n,
            "seed": seed,
            "inputs": ("numpy.random.default_rng(seed): b = integers(-128, 128, (N, K), dtype=int8), then "
                       "calls x a = integers(-128, 128, (M, K), dtype=int8)"),
            "a_sha256": [sha256(a) for a in a_list], "b_sha256": sha256(b),
            "plan": {k: v for k, v in p.items() if k != "tasks"},
            "tasks": p["tasks"],
            "commands": {
                "addresses": {k: f"0x{v:08x}" for k, v in FIXED.items()},
                "address_source": ("fixed: the backends do not expose the cmd/in/out NPU addresses they "
                                   "used (only each weight's npu_address, in results.*.w_addr)"),
                "qwords": [f"{int(q):016x}" for q in cmd],
                "sha256": sha256(cmd.astype("<u8")),
                "bin": name + ".regcmd.bin",
                "emulated_equal_reference": fixture_ok,
                **({"emulate_error": fixture_err} if fixture_err else {}),
            },
            "output": "int32 (M, N), SHA-256 of its little-endian C-order bytes",
            "reference_sha256": ref_sha,
            "results": {be: {**{k: v for k, v in r.items() if k != "label"}, "fake": bool(args.fake and be != "emu")}
                        for be, r in results.items()},
            "ok": shape_ok,
        }
        write_atomic(os.path.join(args.out, name + ".regcmd.bin"), cmd.astype("<u8").tobytes())
        write_json(os.path.join(args.out, name + ".json"), fixture)
        written += [name + ".json", name + ".regcmd.bin"]
        summary.append({"name": name, "n_tasks": p["n_tasks"], "ok": shape_ok})
        del a_list, b, refs

    if args.model == "run" and args.int4 != "only":
        print("-" * len(hdr))
        model = run_model(args, devs, labels)
        all_ok = all_ok and model["ok"]
    run = {
        **environment(argv),
        "mode": mode, "backends": backends, "unavailable": missing, "open_errors": open_errors,
        "devices": {b: device_info(d) for b, d in devs.items()},
        "shapes": summary, "files": written, "ok": all_ok,
        "int4": {"step": args.int4, "shapes": int4_summary, "ok": int4_ok,
                 "unverified_registers": npu.int4_register_facts()},
    }
    if args.model == "run" and args.int4 != "only":
        run["model"] = model
    for d in devs.values():
        d.close()
    print("-" * len(hdr))
    if args.quantize == "run" and args.int4 != "only":
        run["quantize"] = run_quantize(args)
        run["ok"] = all_ok = all_ok and run["quantize"]["ok"]
        print("-" * len(hdr))
    write_json(os.path.join(args.out, "board-run.json"), run)
    bad = ([s["name"] for s in int4_summary if not s["ok"]] + [s["name"] for s in summary if not s["ok"]]
           + [f"open {b}" for b in open_errors] + (["model"] if "model" in run and not run["model"]["ok"] else [])
           + (["quantize"] if "quantize" in run and not run["quantize"]["ok"] else []))
    print(f"{'ALL EQUAL' if all_ok else 'FAILED: ' + ', '.join(bad)}; fixtures in {args.out}")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
