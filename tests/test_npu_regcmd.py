"""NPU register commands (first slice of the NPU layer): the matmul task body
equals the captured streams in ../shared/docs/npu/golden-matmul-regcmd.txt
qword for qword; the decoder and `orkpy npu-dump`; limits."""
import re

import numpy as np
import pytest

from orkpy import npu
from orkpy.cli import main


def golden(shared):
    text = (shared / "docs" / "npu" / "golden-matmul-regcmd.txt").read_text()
    blocks, cur = {}, None
    for line in text.splitlines():
        if line.startswith("=="):
            cur = line
            blocks[cur] = []
        elif cur and re.match(r"^\s*\d+\s+[0-9a-f]{16}", line):
            blocks[cur].append(int(line.split()[1], 16))
    return blocks


def test_int8_matmul_task_equals_capture(shared):
    g = golden(shared)
    key = next(k for k in g if k.startswith("== int8 M=1 K=4096 N=4096"))
    ours = npu.matmul_task(1, 4096, 4096, 0x10000000, 0x20000000, 0x30000000, "int8")
    assert len(g[key]) == 108
    diff = [(i, hex(a), hex(b)) for i, (a, b) in enumerate(zip(ours.tolist(), g[key])) if a != b]
    assert not diff


def test_fp16_matmul_task_equals_capture(shared):
    g = golden(shared)
    key = next(k for k in g if k.startswith("== fp16->fp32 M=4 K=64 N=16"))
    want = g[key]
    # the capture's addresses are those of its own buffers: take them from the stream
    addr = {0x1070: 0, 0x1110: 0, 0x4020: 0}
    for q in want:
        if (q & 0xFFFF) in addr:
            addr[q & 0xFFFF] = (q >> 16) & 0xFFFFFFFF
    ours = npu.matmul_task(4, 64, 16, addr[0x1070], addr[0x1110], addr[0x4020], "fp16")
    assert ours.tolist() == want


def test_decode_and_dump(tmp_path, capsys):
    q = npu.matmul_task(4, 64, 32, 0x1000, 0x2000, 0x3000)
    rows = npu.decode(q)
    assert rows[21][5:] == ("CNA", "CNA_FEATURE_DATA_ADDR") and rows[21][4] == 0x1000
    assert rows[107][4] == 0xD and rows[107][5] == "OP_EN"
    p = tmp_path / "cmds.bin"
    p.write_bytes(q.astype("<u8").tobytes())
    assert main(["npu-dump", str(p)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 108 and "DPU.DPU_DST_BASE_ADDR" in out[57] and "0x00003000" in out[57]
    t = tmp_path / "cmds.txt"
    t.write_text("\n".join(f"{i} {x:016x}" for i, x in enumerate(q.tolist())))
    assert np.array_equal(npu.read_commands(t), q)
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"\x01\x02\x03")
    assert main(["npu-dump", str(bad)]) == 2


@pytest.mark.parametrize("args", [(3, 64, 32), (4, 60, 32), (4, 64, 16), (4, 16384, 32), (4096, 4096, 32)])
def test_limits(args):
    with pytest.raises(ValueError):
        npu.matmul_task(*args, 0, 0, 0, "int8")


def test_bad_dtype():
    with pytest.raises(ValueError, match="dtype"):
        npu.matmul_task(4, 64, 32, 0, 0, 0, "int4")
