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


# ---------------------------------------------------------------------------
# Goldens through the planner, compared as decoded (target, register, value)
# lists with the address registers masked, and the facts of the public
# captures that are not full dumps (npu-anchors.md §1.3, §1.10).
ADDRESS_REGS = {(0x0201, 0x1070), (0x0201, 0x1110), (0x1001, 0x4020), (0x0101, 0x0010)}

# Known, allowed differences between orkpy's streams and published ones:
ALLOWED_DIFFERENCES = {
    "vendor librknnrt prefix": "the vendor runtime prepends CBUF_CON0, DCOMP_REGNUM, DCOMP_CTRL, CONV_CON1 before "
                               "DPU_S_POINTER (body 108 instead of 104); orkpy writes each register once",
    "vendor CONV_CON1 bit 29": "the vendor sets GROUP_LINE_OFF (bit 29) in CNA_CONV_CON1 (0x20000120 for fp16); "
                               "mtx512's generator and orkpy leave it 0",
    "Mesa chain amount": "Mesa's rocket driver writes ALIGN((count-4)/2, 2) as the next amount (108 -> 54); orkpy "
                         "follows the vendor driver and the captured RKNN chain (108 -> 55)",
}


def triples(q):
    out = []
    for x in np.asarray(q, dtype=np.uint64).tolist():
        t, r, v = x >> 48, x & 0xFFFF, (x >> 16) & 0xFFFFFFFF
        out.append((t, r, None if (t, r) in ADDRESS_REGS else v))
    return out


def test_planner_reproduces_the_int8_golden(shared):
    g = golden(shared)
    want = g[next(k for k in g if k.startswith("== int8 M=1 K=4096 N=4096"))]
    p = npu.plan(1, 4096, 4096)
    assert p["n_tasks"] == 1
    ours = npu.plan_commands(1, 4096, 4096, 0x7000, 0x1000, 0x100000, 0x2000000)
    assert triples(ours) == triples(want)


def test_vendor_capture_facts_fp16_4x64x32():
    """wtwver/npu dump/rknn_matmul_api_demo_2.txt (decoded in npu-anchors §1.10):
    the registers it quotes equal ours, up to the listed allowed differences."""
    q = npu.matmul_task(4, 64, 32, 0xFFFB4000, 0xFFFB3000, 0xFFFB8000, "fp16")
    regs = {(t, r): v for t, r, v in triples(q)}
    assert regs[(0x0201, 0x100C)] | (1 << 29) == 0x20000120  # CONV_CON1 (allowed: GROUP_LINE_OFF)
    assert regs[(0x1001, 0x4010)] == 0xA8000002  # DPU_DATA_FORMAT
    assert regs[(0x0201, 0x1024)] == 0x003F0040  # DATA_SIZE1
    assert regs[(0x0801, 0x3018)] == 0x1F  # DATAOUT_SIZE_1
    assert regs[(0x0201, 0x1010)] == 5 << 4  # feature grains = M + 1
    assert [int(x) for x in q[104:]] == [0, 0x0101000000000014, 0x0041000000000000, 0x00810000000D0008]
    assert len(q) == 108  # 104 body + tail; the vendor body is 108 = ours + its 4-register prefix (allowed)


def test_pc_amounts_of_the_captured_rknn_chain():
    """allbilly pcchain.md: a captured RKNN 394x394x394 GEMM chain with task
    bodies 108, 108, 13, 12, ..., 17 carries next amounts 55, 8, 7, ..., 10."""
    for body, amount in [(108, 55), (13, 8), (12, 7), (17, 10)]:
        assert npu.pc_amount(body) == amount
    chained = npu.plan_commands(4, 64, 64, 0x1000, 0x2000, 0x3000, 0x4000, max_n=32)
    assert (int(chained[105]) >> 16) & 0xFFFFFFFF == npu.pc_amount(104)
