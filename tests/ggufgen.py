"""A tiny GGUF writer for tests: builds valid files and lets a test break any
field. Independent of orkpy's reader (it only shares the published layout)."""
import struct

import numpy as np

UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_FMT = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i", FLOAT32: "<f",
        BOOL: "<B", UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}


def gstr(s):
    b = s.encode() if isinstance(s, str) else bytes(s)
    return struct.pack("<Q", len(b)) + b


def value(vtype, v, elem_type=None):
    if vtype == STRING:
        return gstr(v)
    if vtype == ARRAY:
        out = struct.pack("<IQ", elem_type, len(v))
        for item in v:
            if elem_type == ARRAY:
                sub_type, sub = item
                out += value(ARRAY, sub, sub_type)
            else:
                out += value(elem_type, item)
        return out
    return struct.pack(_FMT[vtype], v)


def kv(key, vtype, v, elem_type=None):
    return gstr(key) + struct.pack("<I", vtype) + value(vtype, v, elem_type)


def tensor_info(name, ne, ggml_type, offset):
    return gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne) + \
        struct.pack("<IQ", ggml_type, offset)


def align(n, a):
    return n + (a - n % a) % a


def build(kvs=(), tensors=(), version=3, alignment=32, magic=b"GGUF", n_kv=None, n_tensors=None):
    """kvs: list of kv() byte strings. tensors: list of (name, ne, ggml_type, data_bytes);
    offsets are assigned contiguously with padding. Returns (bytes, layout dict)."""
    head = magic + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                               len(kvs) if n_kv is None else n_kv)
    body = b"".join(kvs)
    infos, blobs, off = [], [], 0
    for name, ne, gt, data in tensors:
        infos.append(tensor_info(name, ne, gt, off))
        blobs.append((off, data))
        off = align(off + len(data), alignment)
    meta_end = len(head) + len(body)
    info_bytes = b"".join(infos)
    pre = head + body + info_bytes
    data_start = align(len(pre), alignment)
    out = bytearray(pre + b"\0" * (data_start - len(pre)))
    for o, d in blobs:
        need = data_start + o + len(d)
        if len(out) < need:
            out += b"\0" * (need - len(out))
        out[data_start + o: need] = d
    layout = {"header_end": len(head), "meta_end": meta_end, "infos_end": len(pre), "data_start": data_start}
    return bytes(out), layout


def small_valid_file():
    """A valid v3 file with every value type, a nested array, and 3 tensors."""
    kvs = [
        kv("general.architecture", STRING, "llama"),
        kv("general.alignment", UINT32, 32),
        kv("t.u8", UINT8, 200), kv("t.i8", INT8, -5), kv("t.u16", UINT16, 65000), kv("t.i16", INT16, -300),
        kv("t.u32", UINT32, 4000000000), kv("t.i32", INT32, -7), kv("t.f32", FLOAT32, 1.5),
        kv("t.bool", BOOL, 1), kv("t.u64", UINT64, 2**63 + 5), kv("t.i64", INT64, -(2**40)),
        kv("t.f64", FLOAT64, 0.25),
        kv("t.strs", ARRAY, ["a", "bc", "\u00e9"], STRING),
        kv("t.ints", ARRAY, [1, 2, 3], INT32),
        kv("t.nested", ARRAY, [(UINT8, [1, 2]), (STRING, ["x"])], ARRAY),
    ]
    w = np.arange(64 * 4, dtype=np.float32).reshape(4, 64) / 7
    h = (np.arange(32 * 2, dtype=np.float32).reshape(2, 32) - 10).astype(np.float16)
    n = np.ones(64, np.float32)
    tensors = [("w.weight", (64, 4), 0, w.tobytes()),
               ("h.weight", (32, 2), 1, h.tobytes()),
               ("norm.weight", (64,), 0, n.tobytes())]
    data, layout = build(kvs, tensors)
    return data, layout, {"w.weight": w, "h.weight": h.astype(np.float32), "norm.weight": n}


def build_raw(kvs=(), infos=(), data=b"", alignment=32, version=3, magic=b"GGUF"):
    """Header + given kv/info byte strings + padding + data (offsets are the caller's)."""
    pre = magic + struct.pack("<IQQ", version, len(infos), len(kvs)) + b"".join(kvs) + b"".join(infos)
    return pre + b"\0" * (align(len(pre), alignment) - len(pre)) + data
