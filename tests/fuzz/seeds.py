"""Write a seed corpus for tests/fuzz/fuzz_gguf into a directory.

    python3 tests/fuzz/seeds.py OUTDIR [--shared PATH]

Nothing is stored in the repository: the corpus is generated at run time from
  * the real llama.cpp files in ../shared/models/*/*.gguf, truncated to their
    first 64 KiB (their metadata and tensor infos; the data is cut off, so these
    exercise the rejection paths deep in a real header);
  * "shrunk" copies of the same files that still parse: the real header with
    every metadata array cut to a few elements, and a handful of the real
    tensors (a few per ggml type, big ones cut to their first rows, relocated)
    so that the dequantizers see real blocks of every type the files hold;
  * crafted files from tests/ggufgen.py: small_valid_file(), one tensor of every
    type the dequantizers support, every ggml type id, v2, custom alignment,
    nested arrays, edge-case values;
  * the crafted corrupt cases of tests/test_gguf.py (CORRUPT), when importable.
"""
import argparse
import hashlib
import os
import pathlib
import struct
import sys

HERE = pathlib.Path(__file__).resolve().parent
TESTS = HERE.parent
ROOT = TESTS.parent
sys.path.insert(0, str(TESTS))

import ggufgen  # noqa: E402
from ggufgen import (ARRAY, BOOL, FLOAT32, FLOAT64, INT8, INT16, INT32, INT64, STRING, UINT8, UINT16,  # noqa: E402
                     UINT32, UINT64, build, kv)

TRUNCATE = 64 * 1024

#: ggml type id -> (block_size, type_size): ggml's table (csrc/ork/ggml_types.c)
GGML_TYPES = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 36),
    10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
    16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110),
    22: (256, 82), 23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8),
    29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66), 39: (32, 17), 40: (64, 36), 41: (128, 18),
    42: (64, 18),
}
#: the types ork_dequant_row implements (dequant.h)
DEQUANT_TYPES = (0, 1, 30, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 20, 23)

_SCALAR_SIZE = {UINT8: 1, INT8: 1, BOOL: 1, UINT16: 2, INT16: 2, UINT32: 4, INT32: 4, FLOAT32: 4,
                UINT64: 8, INT64: 8, FLOAT64: 8}


# ------------------------------------------------- a minimal GGUF walker --
class _Reader:
    def __init__(self, data):
        self.d, self.p = data, 0

    def u32(self):
        v = struct.unpack_from("<I", self.d, self.p)[0]
        self.p += 4
        return v

    def u64(self):
        v = struct.unpack_from("<Q", self.d, self.p)[0]
        self.p += 8
        return v

    def raw(self, n):
        if n > len(self.d) - self.p:
            raise ValueError("truncated")
        b = self.d[self.p:self.p + n]
        self.p += n
        return b

    def string(self):
        return self.raw(self.u64())


def _shrunk_value(r, vtype, keep):
    """Read a value and return its encoding with every array cut to `keep` elements."""
    if vtype in _SCALAR_SIZE:
        return r.raw(_SCALAR_SIZE[vtype])
    if vtype == STRING:
        s = r.string()
        return struct.pack("<Q", len(s)) + s
    if vtype != ARRAY:
        raise ValueError(f"value type {vtype}")
    et, count = r.u32(), r.u64()
    n = min(count, keep)
    if et in _SCALAR_SIZE:
        body = r.raw(count * _SCALAR_SIZE[et])[:n * _SCALAR_SIZE[et]]
        return struct.pack("<IQ", et, n) + body
    parts = [_shrunk_value(r, et, keep) for _ in range(count)][:n]
    return struct.pack("<IQ", et, n) + b"".join(parts)


def shrink_real_file(data, keep_elems=8, per_type=2, max_tensor_bytes=16384, budget=48 * 1024):
    """A valid GGUF built from a real file: its metadata (arrays cut to keep_elems
    elements, general.alignment kept) and up to per_type tensors of each type, each
    cut to its first rows so it holds at most max_tensor_bytes."""
    r = _Reader(data)
    if r.raw(4) != b"GGUF":
        raise ValueError("not GGUF")
    version = r.u32()
    n_t, n_kv = r.u64(), r.u64()
    kvs, alignment = [], 32
    for _ in range(n_kv):
        key = r.string()
        vtype = r.u32()
        start = r.p
        val = _shrunk_value(r, vtype, keep_elems)
        if key == b"general.alignment" and vtype == UINT32:
            alignment = struct.unpack_from("<I", data, start)[0]
        kvs.append(struct.pack("<Q", len(key)) + key + struct.pack("<I", vtype) + val)
    infos = []
    for _ in range(n_t):
        name = r.string()
        nd = r.u32()
        ne = tuple(r.u64() for _ in range(nd))
        gt, off = r.u32(), r.u64()
        infos.append((name, ne, gt, off))
    data_start = ggufgen.align(r.p, alignment)
    tensors, seen, total = [], {}, 0
    for name, ne, gt, off in infos:
        if gt not in GGML_TYPES:
            continue
        bs, ts = GGML_TYPES[gt]
        nel = 1
        for d in ne:
            nel *= d
        if not ne or ne[0] % bs:
            continue
        row_bytes = ne[0] // bs * ts
        rows = nel // ne[0]
        if rows * row_bytes > max_tensor_bytes:  # keep the first rows of a big tensor
            rows = max_tensor_bytes // row_bytes
            ne = (ne[0], rows)
        nbytes = rows * row_bytes
        if rows == 0 or seen.get(gt, 0) >= per_type or total + nbytes > budget:
            continue
        blob = data[data_start + off:data_start + off + nbytes]
        if len(blob) != nbytes:
            continue
        seen[gt] = seen.get(gt, 0) + 1
        total += ggufgen.align(nbytes, alignment)
        tensors.append((name, ne, gt, blob))
    out, _ = build(kvs, tensors, version=version, alignment=alignment)
    return out


# ------------------------------------------------------- crafted seeds --
def _block_bytes(gt, nblocks, salt):
    """Deterministic pseudo-random block bytes (any byte pattern is valid input)."""
    ts = GGML_TYPES[gt][1]
    out, i = bytearray(), 0
    while len(out) < ts * nblocks:
        out += hashlib.sha256(f"{gt}/{salt}/{i}".encode()).digest()
        i += 1
    return bytes(out[:ts * nblocks])


def crafted():
    seeds = {}
    data, _, _ = ggufgen.small_valid_file()
    seeds["small_valid"] = data
    seeds["empty_v3"], _ = build()
    seeds["empty_v2"], _ = build(version=2)
    seeds["one_kv"], _ = build([kv("general.architecture", STRING, "llama")])
    # one tensor of every type the dequantizers support (2 blocks, 2-D)
    for gt in DEQUANT_TYPES:
        bs = GGML_TYPES[gt][0]
        ne = (bs * 2, 1) if bs > 1 else (16, 2)
        nbl = 2 if bs > 1 else 32
        seeds[f"dequant_type_{gt}"], _ = build([kv("general.alignment", UINT32, 32)],
                                               [(f"t{gt}.weight", ne, gt, _block_bytes(gt, nbl, 0))])
    # every valid ggml type id in one file, one block each
    ts = [(f"type{gt}", (GGML_TYPES[gt][0],), gt, _block_bytes(gt, 1, 1)) for gt in sorted(GGML_TYPES)]
    seeds["all_type_ids"], _ = build([], ts)
    # all supported types, several tensors, alignment 64 and 8
    ts = [(f"blk.{i}.w", (GGML_TYPES[gt][0] * 3, 2, 1, 1), gt, _block_bytes(gt, 6, 2))
          for i, gt in enumerate(DEQUANT_TYPES)]
    seeds["all_dequant_align64"], _ = build([kv("general.alignment", UINT32, 64)], ts, alignment=64)
    seeds["all_dequant_align8_v2"], _ = build([kv("general.alignment", UINT32, 8)], ts, alignment=8, version=2)
    # special half values: subnormals, Inf, NaN as block scales
    halves = struct.pack("<8H", 0x0001, 0x03ff, 0x7c00, 0xfc00, 0x7e01, 0x7c01, 0x8000, 0x3c00)
    seeds["f16_specials"], _ = build([], [("h", (8,), 1, halves), ("b", (8,), 30, halves)])
    q80 = b"".join(struct.pack("<H", h) + bytes(range(256 - 32, 256)) for h in (0x7c00, 0x0001, 0x7e00))
    seeds["q8_0_special_scales"], _ = build([], [("q", (96,), 8, q80)])
    # metadata edge cases
    kvs = [
        kv("general.architecture", STRING, "llama"),
        kv("general.name", STRING, ""),
        kv("tokenizer.ggml.tokens", ARRAY, ["<unk>", "<s>", "</s>", "\u00e9\u4e2d\U0001f600", ""], STRING),
        kv("tokenizer.ggml.scores", ARRAY, [0.0, -1.5, 2.0], FLOAT32),
        kv("tokenizer.ggml.token_type", ARRAY, [1, 3, 3], INT32),
        kv("t.bools", ARRAY, [0, 1, 1, 0], BOOL),
        kv("t.empty_arr", ARRAY, [], UINT8),
        kv("t.empty_strs", ARRAY, [], STRING),
        kv("t.u64s", ARRAY, [0, 2**64 - 1], UINT64),
        kv("t.f64s", ARRAY, [float("inf"), float("nan")], FLOAT64),
        kv("t.nested", ARRAY, [(ARRAY, [(ARRAY, [(UINT16, [1, 2, 3])])]), (STRING, ["a", "b"])], ARRAY),
        kv("\u00e9t\u00e9.key", INT8, -128),
        kv("t.i16", INT16, -32768), kv("t.i64", INT64, -(2**63)), kv("t.u16", UINT16, 65535),
    ]
    seeds["metadata_edge"], _ = build(kvs, [("tok_embd.weight", (32, 2), 0, _block_bytes(0, 64, 3))])
    # 1..4 dims, max-length name, tensors with gaps and out-of-order offsets
    ts = [("a" * 63, (32,), 0, bytes(128)), ("b", (32, 1), 2, _block_bytes(2, 1, 4)),
          ("c", (32, 1, 2), 8, _block_bytes(8, 2, 5)), ("d", (256, 1, 1, 1), 12, _block_bytes(12, 1, 6))]
    seeds["dims_and_names"], _ = build([], ts)
    infos = [ggufgen.tensor_info("late", (32,), 0, 256), ggufgen.tensor_info("early", (32,), 0, 0)]
    seeds["out_of_order_offsets"] = ggufgen.build_raw([], infos, bytes(512))
    return seeds


def corrupt_cases():
    """The corrupt-file suite of tests/test_gguf.py, {name: bytes} ({} if it cannot be imported)."""
    try:
        import test_gguf
    except BaseException:  # noqa: BLE001 - pytest.importorskip raises a BaseException subclass
        return {}
    return {name: data for name, (data, _pattern) in test_gguf.CORRUPT.items()}


def _slug(s):
    return "".join(ch if ch.isalnum() else "_" for ch in s)


def write_corpus(outdir, shared=None, with_corrupt=True):
    """Write the seed corpus into outdir; returns the list of written paths."""
    outdir = pathlib.Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    shared = pathlib.Path(shared or os.environ.get("ORKPY_SHARED", ROOT.parent / "shared"))
    written = []

    def put(name, data):
        p = outdir / name
        p.write_bytes(data)
        written.append(p)

    for path in sorted(shared.glob("models/*/*.gguf")):
        with open(path, "rb") as f:
            head = f.read(TRUNCATE)
        put(f"real_{path.stem}_64k", head)
        try:
            with open(path, "rb") as f:
                full = f.read()
            put(f"real_{path.stem}_shrunk", shrink_real_file(full))
        except (ValueError, struct.error):
            pass
    for name, data in crafted().items():
        put(f"crafted_{name}", data)
    if with_corrupt:
        for name, data in corrupt_cases().items():
            put(f"corrupt_{_slug(name)}", data)
    return written


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--shared", default=None, help="the shared data folder (default: ../shared or $ORKPY_SHARED)")
    ap.add_argument("--no-corrupt", action="store_true", help="skip the corrupt cases of tests/test_gguf.py")
    a = ap.parse_args(argv)
    paths = write_corpus(a.outdir, a.shared, with_corrupt=not a.no_corrupt)
    print(f"{len(paths)} seeds, {sum(p.stat().st_size for p in paths)} bytes -> {a.outdir}")


if __name__ == "__main__":
    main()
