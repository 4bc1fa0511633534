"""The RK3588 NPU layer, first slice: the register-command encoding, the
register body of one matmul task, and a decoder for listings (``orkpy
npu-dump``). The C side is csrc/ork/npu/regcmd.{h,c}.

Not written yet (see the issue): the task planner (splitting large matmuls,
PC chaining), operand packing, the strict emulator, and the rknpu / rocket
device backends. There is no RK3588 board here, so nothing in this module has
run on hardware; its matmul bodies are checked against captured register
streams (../shared/docs/npu/golden-matmul-regcmd.txt).
"""
import numpy as np

from . import _core


def matmul_task(M, K, N, in_addr, w_addr, out_addr, dtype="int8"):
    """uint64[108]: the register commands of one stand-alone matmul task
    (``dtype`` "int8" = int8 x int8 -> int32, "fp16" = fp16 x fp16 -> fp32)."""
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
    with one hex qword per line (an optional leading index column is skipped)."""
    data = open(path, "rb").read()
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
                raise ValueError(f"{path}:{n}: not a hex qword: {tok!r}") from None
            if out[-1] >> 64:
                raise ValueError(f"{path}:{n}: {tok!r} is wider than 64 bits")
        return np.array(out, dtype=np.uint64)
    if len(data) % 8:
        raise ValueError(f"{path}: {len(data)} bytes is not a whole number of 64-bit commands")
    return np.frombuffer(data, dtype="<u8").astype(np.uint64)
