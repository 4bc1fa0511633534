"""Seed corpus for fuzz_npu_emu: orkpy's own command streams (single tasks and
PC chains) for the fixed buffer addresses of the target, prefixed by the
(task_number - 1, amount) bytes. Generated at run time, never stored.

    python3 tests/fuzz/seeds_npu.py OUTDIR
"""
import pathlib
import sys

CMD, IN, W, OUT = 0x00010000, 0x00100000, 0x00200000, 0x00300000
SHAPES = [(1, 64, 32, {}), (4, 64, 32, {}), (4, 256, 64, dict(max_n=32)), (8, 128, 64, dict(max_k=64, max_n=32)),
          (4, 96, 96, dict(max_n=32)), (1, 512, 128, dict(max_k=128))]


def write_corpus(out):
    import orkpy.runtime.npu as npu
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for i, (M, K, N, caps) in enumerate(SHAPES):
        q = npu.plan_commands(M, K, N, CMD, IN, W, OUT, **caps)
        tasks = len(q) // 108
        for t in (tasks, 1):
            p = out / f"seed-{i}-{t}"
            p.write_bytes(bytes([min(t, 8) - 1, npu.pc_amount(104)]) + q.astype("<u8").tobytes())
            written.append(p)
    return written


if __name__ == "__main__":
    print(len(write_corpus(sys.argv[1])), "seeds")
