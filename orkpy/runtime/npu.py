"""The RK3588 NPU layer: int8 x int8 -> int32 matmuls (and int4 x int4 ->
int16 tiles combined in int32: ``precision="int4"``, :func:`matmul_w4a4`)
planned into tasks, packed into the NPU's layouts, encoded as PC-chained
register commands and run by a backend:

  ``emu``     a strict emulator of the command stream (any machine);
  ``rknpu``   the vendor kernel driver (/dev/dri/*, driver "rknpu");
  ``rocket``  the mainline accel driver (/dev/accel/*, Linux 6.18+).

One C pipeline (csrc/ork/npu: plan.c, regcmd.c, backend.c) produces the same
bytes for every backend; the device backends differ only in the ioctls.

There is no RK3588 board here: the rknpu and rocket paths have run only
against the fake kernel, test machinery reached through
``orkpy.evaluation.testing.fake_npu_device(backend)``, which checks each driver's
documented contract and executes the submitted commands with the emulator.
The emulator's semantics are the published facts listed in docs/npu.md;
tests/board/run_board.py checks them on a board.

    >>> import numpy as np, orkpy.runtime.npu as npu
    >>> a = np.ones((4, 64), np.int8); b = np.ones((32, 64), np.int8)
    >>> int(npu.matmul(a, b)[0, 0])
    64
"""
import threading
from typing import Any, Dict, List

import numpy as np

from .. import _core
from .._core import FormatError, NPUCommandError, NPUError, NPUTimeoutError, NPUUnavailableError  # noqa: F401
from .._mapped import guarded, maps_of
from ..kernels.quant import KIND_INFO, KINDS

#: The backends, from the C table (csrc/ork/npu/backend.h): "emu", "rknpu", "rocket".
BACKENDS = _core.npu_backends()
# fault bits of the fake kernel (test machinery: orkpy.evaluation.testing.FAKE_HANG / FAKE_DROP, Device.set_faults)
FAKE_HANG = 1
FAKE_NO_DEVICE = 2


_FAKE_KERNEL_LIBS: List[Any] = []  # loaded fake kernel libraries, kept alive: the core holds their tables


def load_fake_kernel(path):
    """Test machinery: load the fake kernel driver library (tests/npu_fake, built by
    ``tests/cbuild.py build_fake_kernel``; the shipped extension holds no fake kernel) and hand
    its table to the core, so that ``Device(backend, fake_kernel=backend)`` and
    ``orkpy.evaluation.testing.fake_npu_device`` work. Idempotent; the library stays loaded."""
    import ctypes

    lib = ctypes.CDLL(str(path))
    table = lib.ork_npu_fake_kernel_table
    table.restype = ctypes.c_void_p
    _core._npu_install_fake_kernel_for_tests(table())
    _FAKE_KERNEL_LIBS.append(lib)


def unavailable():
    """{backend: reason} for every backend that cannot be opened here."""
    out = {}
    for b in BACKENDS:
        why = _core.npu_probe(b)
        if why is not None:
            out[b] = why
    return out


def available():
    """Names of the backends this machine has ("emu" always)."""
    bad = unavailable()
    return [b for b in BACKENDS if b not in bad]


#: The precisions of a plan: "int8" (int8 x int8 -> int32) and "int4" (int4 x int4 -> int16 per K tile of at
#: most INT4_MAX_KT codes, the tiles' int16 blocks summed on the host in int32; csrc/ork/npu/plan.h, "int4").
PRECISIONS = ("int8", "int4")
#: The packed kinds whose weights the NPU multiplies in its int4 mode (integer codes stored in 4 bits:
#: w4a4, w4a8; derived from the kind registry): :meth:`Device.upload` keeps them in the int4 layout.
INT4_KINDS = tuple(k for k, i in KIND_INFO.items() if i.levels is None and i.store_bits == 4)
#: The largest K tile of an int4 plan: 480 x 8 x 8 = 30720 <= 32767, so no int16 partial overflows for any codes.
INT4_MAX_KT = 480


def plan(M, K, N, *, max_m=0, max_k=0, max_n=0, precision="int8"):
    """The task split of an (M, K) x (K, N) matmul: a dict with precision,
    n_tasks, nm / nk / nn tiles, buffer sizes (in_bytes, w_bytes, out_bytes,
    cmd_bytes), out_esz (bytes per output element: 4, int4: 2), macs and the
    per-task list. max_* lower the per-task caps (to force chains in tests).
    ``precision="int4"``: K tiles of at most :data:`INT4_MAX_KT`, N in 64s,
    half-byte operands, int16 output blocks."""
    return _core.npu_plan(M, K, N, max_m, max_k, max_n, precision)


def plan_commands(M, K, N, cmd_addr, in_addr, w_addr, out_addr, *, max_m=0, max_k=0, max_n=0, precision="int8"):
    """uint64 command buffer of a whole plan (tasks chained through their PC tails)."""
    return _core.npu_plan_emit(M, K, N, cmd_addr, in_addr, w_addr, out_addr, max_m, max_k, max_n, precision)


def int4_register_facts():
    """The int4 x int4 -> int16 task's register values that no public source gives, from the one
    table in csrc/ork/npu/regcmd.c: [dict(register, field, value (None when a formula), formula,
    basis)]. Every row is unverified until tests/board/run_board.py's int4 step passes on a board
    (docs/npu.md, "int4 register values")."""
    return _core.npu_int4_facts()


def chain_plan(shapes, *, max_m=0, max_k=0, max_n=0, precision="int8"):
    """The layout of a chained job (csrc/ork/npu/plan.h, "chains"): the
    matmuls ``shapes`` [(M, K, N) or (M, K, N, precision), ...] planned one after another in one
    command, input and output buffer. A dict with n_tasks (all of them, one
    submit), in_bytes / out_bytes / cmd_bytes and ``parts``: per matmul its
    n_tasks and the offsets of its regions (in_off, out_off, cmd_off; each
    region holds that matmul's own plan() layout). A shape without its own
    precision has ``precision``."""
    return _core.npu_chain_plan([tuple(s) for s in shapes], max_m, max_k, max_n, precision)


def chain_commands(shapes, cmd_addr, in_addr, w_addrs, out_addr, *, max_m=0, max_k=0, max_n=0, precision="int8"):
    """uint64 command buffer of a chained job: every matmul's tasks chained
    through their PC tails, the last task of matmul i linked to the first of
    matmul i + 1 (one submit of chain_plan()["n_tasks"] tasks). ``w_addrs``:
    one weight buffer address per matmul."""
    return _core.npu_chain_emit([tuple(s) for s in shapes], cmd_addr, in_addr, list(w_addrs), out_addr, max_m, max_k,
                                max_n, precision)


def layout(op, M, K, N, array, *, max_m=0, max_k=0, max_n=0, precision="int8"):
    """Operand layouts of a plan: op is pack_input (A (M, K) int8 -> uint8),
    pack_weights (B (N, K) int8 -> uint8), unpack_input, unpack_weights,
    unpack_output (uint8 -> int32 (M, N), K tiles summed). ``precision="int4"``:
    A and B hold codes in [-8, 7] (anything else is a ValueError naming it),
    packed two per byte (even k in the low nibble); the output blocks are int16."""
    return _core.npu_layout(op, M, K, N, array, max_m, max_k, max_n, precision)


def emulate(buffers, first_addr, amount, task_number=1):
    """Run the strict emulator over command bytes in ``buffers`` ([(npu_address,
    writable uint8 array)]). Raises NPUCommandError on anything not modelled."""
    return _core.npu_emulate(buffers, first_addr, amount, task_number)


def pc_amount(body_qwords):
    """PC_REGISTER_AMOUNTS for a task body of this many qwords (csrc/ork/npu/regcmd.h)."""
    return _core.npu_pc_amount(body_qwords)


class Device:
    """An open NPU backend.

    ``Device("emu")`` always works; ``Device("rknpu")`` / ``Device("rocket")``
    open the real driver or raise NPUUnavailableError saying why. Weights are
    uploaded once (``upload``) and reused for any number of rows.

    Test machinery, not for production use: ``fake_kernel="rknpu"`` (or
    "rocket", naming the backend) runs the device backend against an
    in-process fake of the kernel driver instead of /dev, and ``set_faults``
    injects failures into that fake; ``orkpy.evaluation.testing.fake_npu_device`` is the
    documented way to get such a device. The fake is a test-only library outside
    the shipped extension: :func:`load_fake_kernel` first (else UnavailableError).
    """

    def __init__(self, backend="emu", *, fake_kernel=None, emu_base=0, timeout_ms=10000):
        if backend not in BACKENDS:
            raise ValueError(f"unknown NPU backend {backend!r} (expected one of {', '.join(BACKENDS)})")
        self.backend = backend
        self._dev = _core.NPUDevice(backend, fake_kernel, emu_base, timeout_ms)

    def upload(self, b, *, max_m=0, max_k=0, max_n=0, precision=None):
        """b: an int8 (N, K) array or a PackedWeight; scales stay on the host.
        ``precision`` (None: "int4" for a PackedWeight of a kind the NPU runs in its int4
        mode -- w4a4, w4a8 -- else "int8"): "int8" uploads b's int8 values (the codes of
        int8, the LUT values of nf4/int4, w4a4 / w4a8 codes inflated to a byte);
        "int4" keeps b resident in the int4 layout (half a byte a weight): an array of
        codes in [-8, 7], whose matmuls take int4 activation codes, or a w4a4 / w4a8
        PackedWeight, whose matmuls take its kind's activation codes (w4a8: int8 codes
        in [-128, 119], each run as two int4 digit rows, docs/w4a4.md). Every matmul
        returns the exact int32 product (int16 K tiles summed); a PackedWeight with
        group-wise scales (``pw.group``) returns its (G, M, N) per-group partial sums,
        one K tile per group, which its scales turn into the output on the host."""
        from ..kernels.packed import PackedWeight

        if isinstance(b, PackedWeight):
            if precision is None:
                precision = "int4" if b.kind in INT4_KINDS else "int8"
            return self._upload_store(b.kind, b.store, *b.shape, max_m=max_m, max_k=max_k, max_n=max_n,
                                      precision=precision, group=b.group)
        return self._dev.upload(_int8_matrix(b, "b"), max_m, max_k, max_n, precision or "int8")

    def _upload_store(self, kind, store, N, K, *, max_m=0, max_k=0, max_n=0, precision="int8", group=0):
        """A packed tile store of ``kind`` (N, K) (pack.h layout) -> NPUWeight; ``group`` > 0: K tiles on the
        group boundaries and each group's partial sums returned apart (docs/npu.md "Group-wise scales")."""
        from ..kernels.packed import _lut
        lut = _lut(kind)
        lut = np.zeros(16, np.int8) if lut is None else np.asarray(lut, dtype=np.int8)  # int8 needs no LUT
        with guarded(maps_of(store)):  # a store viewing a file that changes raises FormatError (docs/security.md)
            return self._dev.upload_packed(kind, np.ascontiguousarray(store).reshape(-1).view(np.uint8), lut, N, K,
                                           max_m, max_k, max_n, precision, group)

    def matmul(self, a, b, **opts):
        """int32 (M, N) = a (M, K) int8 times b (an uploaded weight, a
        PackedWeight, or an int8 (N, K) array, uploaded for this call);
        (G, M, N) per-group partial sums for a grouped weight."""
        if isinstance(b, _core.NPUWeight):
            if opts:
                raise ValueError(f"tile caps {sorted(opts)} are fixed when a weight is uploaded; pass them to upload()")
            w = b
        else:
            w = self.upload(b, **opts)
        a = _int8_matrix(a, "a")
        return self._dev.matmul(w, a)

    def job(self, weights, M=1, **caps):
        """A :class:`Job`: the matmuls of ``weights`` (uploaded NPUWeights; int8
        arrays or PackedWeights are uploaded here with ``caps``) at ``M`` rows,
        chained into ONE submit and planned + emitted once. Use it for matmuls
        that share no data dependency, e.g. a layer's q / k / v or gate / up."""
        ws = []
        for w in weights:
            if isinstance(w, _core.NPUWeight):
                if caps:
                    raise ValueError(f"tile caps {sorted(caps)} are fixed when a weight is uploaded; pass them to "
                                     "upload()")
                ws.append(w)
            else:
                ws.append(self.upload(w, **caps))
        return Job(self._dev.job(ws, int(M)))

    def info(self):
        """Backend, node and counters: ``submits`` (jobs handed to the NPU), ``plans``
        (command buffers planned and emitted: one per ``matmul`` call, one per
        ``Job`` however often it runs), ``tasks``, bytes to / from the device."""
        return self._dev.info()

    def set_faults(self, bits):
        """Test machinery: inject faults (orkpy.evaluation.testing.FAKE_HANG | FAKE_DROP) into the
        fake kernel of a device opened with ``fake_kernel=``; ValueError on any other device."""
        self._dev.set_faults(bits)

    def close(self):
        self._dev.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Job:
    """Matmuls of resident weights chained into one submit, planned once
    (``Device.job``). The command buffer and the job's own input / output
    buffers are made when the job is; ``run`` only packs the inputs, submits
    once and unpacks: the device's ``info()["plans"]`` does not move and
    ``info()["submits"]`` grows by one per run. The outputs are exactly those
    of separate ``Device.matmul`` calls. The job keeps its weights alive;
    closing the device ends it."""

    def __init__(self, core):
        self._job = core

    @property
    def M(self):
        """Rows of every matmul."""
        return self._job.M

    @property
    def shapes(self):
        """(N, K) of each weight, in chain order."""
        return [w.shape for w in self._job.weights]

    @property
    def n_tasks(self):
        """NPU tasks in the chain (all run in one submit)."""
        return self._job.n_tasks

    def run(self, x):
        """int32 (M, N_i) for every weight i: ``x`` is one int8 (M, K) input
        shared by every matmul (q / k / v read the same activations) or a
        sequence with one input per matmul."""
        n = len(self._job.weights)
        if isinstance(x, np.ndarray):
            x = [x] * n
        return self._job.run([_int8_matrix(a, f"input {i}") for i, a in enumerate(x)])

    def __len__(self):
        return len(self._job.weights)


def _int8_matrix(x, name):
    x = np.asarray(x)
    if x.dtype != np.int8:
        raise TypeError(f"{name} must be an int8 array, got {x.dtype}")
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got {x.ndim}-D")
    return np.ascontiguousarray(x)


_default: Dict[str, "Device"] = {}
_default_lock = threading.Lock()


def matmul(a, b, backend="emu"):
    """int32 (M, N) = a (M, K) int8 x b (PackedWeight or int8 (N, K)) through a
    backend (one shared device per backend)."""
    with _default_lock:
        dev = _default.get(backend)
        if dev is None:
            dev = _default[backend] = Device(backend)
    return dev.matmul(a, b)


def matmul_w4a4(a, b, backend="emu", **caps):
    """int32 (M, N) = a (M, K) x b (N, K), both int8 arrays of int4 codes in [-8, 7], through the
    NPU's int4 x int4 -> int16 mode: planned with ``precision="int4"`` (K tiles of at most
    :data:`INT4_MAX_KT` codes, so no int16 partial overflows), each K tile's int16 block summed on
    the host in int32 -- exactly ``a.astype(int64) @ b.astype(int64).T``. Through the strict
    emulator by default (one shared device per backend, as :func:`matmul`); ``caps``: max_m /
    max_k / max_n. The CPU int4 kernel is checked against this."""
    with _default_lock:
        dev = _default.get(backend)
        if dev is None:
            dev = _default[backend] = Device(backend)
    return dev.matmul(a, dev.upload(b, precision="int4", **caps))


def use_npu(model, device="emu", *, kinds=KINDS):
    """Run a model's packed linear layers of the given kinds through an NPU
    backend (the weights' int8 values are uploaded once). Output stays
    bit-identical to the CPU path whenever the int32 accumulators are. Returns
    the number of linears routed. ``use_npu(model, None)`` routes them back."""
    return model.route_linears(device if device is None or isinstance(device, Device) else Device(device), kinds)


def matmul_task(M, K, N, in_addr, w_addr, out_addr, dtype="int8"):
    """uint64[108]: the register commands of one stand-alone matmul task
    (``dtype`` "int8" = int8 x int8 -> int32, "fp16" = fp16 x fp16 -> fp32,
    "int4" = int4 x int4 -> int16, whose unverified values are
    :func:`int4_register_facts`)."""
    return _core.npu_matmul_task(dtype, M, K, N, in_addr, w_addr, out_addr)


def decode(qwords):
    """[(index, qword, target, reg, value, block, register)] for a command buffer."""
    q = np.asarray(qwords, dtype=np.uint64).reshape(-1)
    rows = []
    for i, x in enumerate(q.tolist()):
        t, r, v = x >> 48, x & 0xFFFF, (x >> 16) & 0xFFFFFFFF
        block, reg = _core.npu_names(t, r)
        rows.append((i, x, t, r, v, block, reg))
    return rows


def dump(qwords):
    """A readable listing, one line per qword; unknown blocks/registers are marked."""
    lines = []
    for i, x, t, r, v, block, reg in decode(qwords):
        name = f"{block or f'?{t:04x}'}.{reg or f'{r:04x}'}"
        lines.append(f"{i:5d}  {x:016x}  {name:<28} = 0x{v:08x}")
    return "\n".join(lines)


def read_commands(path):
    """Qwords from a file: little-endian binary (size a multiple of 8), or text
    with one hex qword per line (an optional leading index column is skipped).
    A file that is not a command stream (see :func:`check_commands`) raises
    orkpy.FormatError naming it."""
    with open(path, "rb") as f:
        data = f.read()
    q = _parse_commands(path, data)
    check_commands(q, path)
    return q


def check_commands(qwords, what="command buffer"):
    """Raise orkpy.FormatError unless ``qwords`` looks like an NPU register
    command stream: not empty, at least half of the qwords in a known block
    (NOP and MARK included), and at least one a named register of a block
    other than NOP. Random bytes fail the first test (a random qword's
    target lands in one of the ten known blocks with odds ~1.5e-4), a
    zero-filled file the second."""
    rows = decode(qwords)
    if not rows:
        raise FormatError(f"{what}: empty: not an NPU command stream")
    in_block = sum(1 for r in rows if r[5] is not None)
    named = sum(1 for r in rows if r[5] not in (None, "NOP") and r[6] is not None)
    if 2 * in_block < len(rows) or not named:
        raise FormatError(f"{what}: not an NPU command stream ({len(rows)} qwords, {in_block} in a known block, "
                          f"{named} naming a known register)")


def _parse_commands(path, data):
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        text = None
    if text is not None and text.strip() and "\x00" not in text:
        out = []
        for n, line in enumerate(text.splitlines(), 1):
            parts = line.split()
            if not parts or parts[0].startswith(("#", "==", "ret")):
                continue
            tok = parts[1] if len(parts) > 1 and parts[0].isdigit() else parts[0]
            try:
                out.append(int(tok, 16))
            except ValueError:
                raise FormatError(f"{path}:{n}: not a hex qword: {tok!r}: not an NPU command stream") from None
            if out[-1] >> 64:
                raise FormatError(f"{path}:{n}: {tok!r} is wider than 64 bits: not an NPU command stream")
        return np.array(out, dtype=np.uint64)
    if len(data) % 8:
        raise FormatError(f"{path}: {len(data)} bytes is not a whole number of 64-bit commands: not an NPU "
                          "command stream")
    return np.frombuffer(data, dtype="<u8").astype(np.uint64)
