"""The GGUF reader: real llama.cpp files, a crafted file with every value
type, and a corrupt-file suite (every case a named GGUFError, never a crash)."""
import struct

import numpy as np
import pytest

import orkpy
from ggufgen import (ARRAY, BOOL, FLOAT32, INT32, STRING, UINT8, UINT32, UINT64, build, build_raw, gstr,
                     kv, small_valid_file, tensor_info)

gguf = pytest.importorskip("gguf")


def write(tmp_path, data, name="x.gguf"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


# --------------------------------------------------------------- valid files --

def test_small_file_every_value_type(tmp_path):
    data, layout, arrays = small_valid_file()
    with orkpy.GGUFFile(write(tmp_path, data)) as g:
        m = g.metadata
        assert g.version == 3 and g.alignment == 32 and g.data_offset == layout["data_start"]
        assert m["general.architecture"] == "llama"
        assert (m["t.u8"], m["t.i8"], m["t.u16"], m["t.i16"]) == (200, -5, 65000, -300)
        assert (m["t.u32"], m["t.i32"], m["t.f32"], m["t.bool"]) == (4000000000, -7, 1.5, True)
        assert (m["t.u64"], m["t.i64"], m["t.f64"]) == (2**63 + 5, -(2**40), 0.25)
        assert m["t.strs"] == ["a", "bc", "\u00e9"]
        assert m["t.ints"].dtype == np.int32 and m["t.ints"].tolist() == [1, 2, 3]
        assert m["t.nested"][0].tolist() == [1, 2] and m["t.nested"][1] == ["x"]
        assert g.metadata_types["t.nested"] == "ARRAY" and g.metadata_types["t.bool"] == "BOOL"
        assert [t.name for t in g.tensors] == ["w.weight", "h.weight", "norm.weight"]
        t = g.tensor_info("w.weight")
        assert t.shape == (4, 64) and t.type == "F32" and t.nbytes == 1024 and t.offset == 0
        assert g.tensor_info("h.weight").type == "F16"
        for name, a in arrays.items():
            assert np.array_equal(g.tensor(name), a)
        raw = g.raw("w.weight")
        assert raw.dtype == np.uint8 and not raw.flags.writeable
        assert raw.tobytes() == arrays["w.weight"].tobytes()
        with pytest.raises(KeyError, match="nope"):
            g.tensor("nope")


def test_version_2_is_read(tmp_path):
    data, _ = build([kv("general.architecture", STRING, "llama")], [("a", (32,), 0, bytes(128))], version=2)
    with orkpy.GGUFFile(write(tmp_path, data)) as g:
        assert g.version == 2 and g.tensors[0].shape == (32,)


def test_default_alignment_is_32_and_custom_alignment(tmp_path):
    data, lay = build([], [("a", (3,), 0, bytes(12)), ("b", (5,), 0, bytes(20))], alignment=32)
    with orkpy.GGUFFile(write(tmp_path, data)) as g:
        assert g.alignment == 32 and g.tensors[1].offset == 32
    data, lay = build([kv("general.alignment", UINT32, 64)], [("a", (3,), 0, bytes(12)), ("b", (5,), 0, bytes(20))],
                      alignment=64)
    with orkpy.GGUFFile(write(tmp_path, data, "b.gguf")) as g:
        assert g.alignment == 64 and g.tensors[1].offset == 64 and g.data_offset % 64 == 0


def _all_model_files(shared):
    return sorted((shared / "models").glob("*/*.gguf"))


def test_real_files_match_gguf_package_reader(shared):
    for path in _all_model_files(shared):
        ref = gguf.GGUFReader(str(path))
        with orkpy.GGUFFile(path) as g:
            assert len(g.tensors) == len(ref.tensors), path
            for t, r in zip(g.tensors, ref.tensors):
                assert t.name == r.name
                assert t.type_id == int(r.tensor_type)
                assert t.shape == tuple(int(d) for d in reversed(r.shape.tolist()))
                assert t.nbytes == int(r.n_bytes)
                assert t.data_offset == int(r.data_offset)
            keys = [k for k in ref.fields if not k.startswith("GGUF.")]
            assert list(g.metadata) == keys
            for k in keys:
                f = ref.fields[k]
                v = g.metadata[k]
                if f.types and f.types[0] == gguf.GGUFValueType.ARRAY:
                    if f.types[-1] == gguf.GGUFValueType.STRING:
                        assert v == [bytes(f.parts[i]).decode("utf-8", "surrogateescape") for i in f.data]
                    else:
                        assert np.array_equal(v, np.array([f.parts[i][0] for i in f.data]))
                elif f.types[0] == gguf.GGUFValueType.STRING:
                    assert v == bytes(f.parts[f.data[0]]).decode()
                else:
                    assert v == f.parts[f.data[0]][0], k


def test_real_files_every_tensor_dequantizes_like_gguf_package(shared):
    from gguf.quants import dequantize
    n_checked = 0
    for path in sorted((shared / "models" / "stories260K").glob("*.gguf")):
        ref = gguf.GGUFReader(str(path))
        with orkpy.GGUFFile(path) as g:
            for t, r in zip(g.tensors, ref.tensors):
                want = dequantize(np.asarray(r.data), r.tensor_type).astype(np.float32).reshape(t.shape)
                got = g.tensor(t.name)
                assert got.dtype == np.float32 and got.shape == t.shape
                np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=f"{path.name}:{t.name}")
                n_checked += 1
    assert n_checked > 100


def test_qwen3_skeleton_q4km_types(shared):
    with orkpy.GGUFFile(shared / "models/qwen3-skeleton/qwen3-skel-tied-Q4_K_M.gguf") as g:
        import collections
        c = collections.Counter(t.type for t in g.tensors)
        assert c == {"Q4_K": 168, "Q6_K": 29, "F32": 113}
        assert g.architecture == "qwen3" and g.metadata["general.file_type"] == 15


def test_raw_is_a_view_not_a_copy(shared):
    p = shared / "models/stories260K/stories260K-F32.gguf"
    with orkpy.GGUFFile(p) as g:
        t = g.tensors[0]
        raw = g.raw(t.name)
        assert raw.base is not None and not raw.flags.owndata
        assert raw.tobytes() == p.read_bytes()[t.data_offset:t.data_offset + t.nbytes]


# ------------------------------------------------------------ corrupt files --

def _hdr(version=3, n_t=0, n_kv=0, magic=b"GGUF"):
    return magic + struct.pack("<IQQ", version, n_t, n_kv)


def _f32_info(name="a", ne=(32,), gt=0, off=0):
    return tensor_info(name, ne, gt, off)


def _nested(depth):
    # depth levels of ARRAY wrapping a u8 array
    b = struct.pack("<IQ", UINT8, 1) + b"\x01"
    for _ in range(depth - 1):
        b = struct.pack("<IQ", ARRAY, 1) + b
    return gstr("deep") + struct.pack("<I", ARRAY) + b


CORRUPT = {
    "empty file": (b"", r"truncated.*magic"),
    "three bytes": (b"GGU", r"truncated.*magic"),
    "bad magic": (_hdr(magic=b"GGUX"), r"bad magic"),
    "gguf lowercase magic": (_hdr(magic=b"gguf"), r"bad magic"),
    "version 1": (_hdr(version=1), r"version 1 is obsolete"),
    "version 0": (_hdr(version=0), r"unsupported GGUF version 0"),
    "version 4": (_hdr(version=4), r"unsupported GGUF version 4"),
    "byte-swapped version": (_hdr(version=0x03000000), r"big-endian"),
    "truncated before tensor count": (b"GGUF" + struct.pack("<I", 3) + b"\0\0\0", r"truncated.*tensor count"),
    "truncated before kv count": (b"GGUF" + struct.pack("<IQ", 3, 0), r"truncated.*metadata count"),
    "huge kv count": (_hdr(n_kv=2**63), r"metadata count .* cannot fit"),
    "huge tensor count": (_hdr(n_t=2**40), r"tensor count .* cannot fit"),
    "key length huge": (_hdr(n_kv=1) + struct.pack("<Q", 2**64 - 1) + b"x" * 20, r"metadata key length .* exceeds"),
    "empty key": (build_raw([gstr("") + struct.pack("<IB", UINT8, 1)]), r"empty metadata key"),
    "key not utf-8": (build_raw([gstr(b"\xff\xfe") + struct.pack("<IB", UINT8, 1)]), r"not valid UTF-8"),
    "duplicate key": (build_raw([kv("a.b", UINT8, 1), kv("a.b", UINT8, 2)]), r"duplicate metadata key 'a.b'"),
    "unknown value type": (build_raw([gstr("k") + struct.pack("<I", 13) + b"\0" * 8]), r"unknown metadata value type 13"),
    "unknown array element type": (build_raw([gstr("k") + struct.pack("<IIQ", ARRAY, 99, 1) + b"\0" * 8]),
                                   r"unknown array element type 99"),
    "numeric array count huge": (build_raw([gstr("k") + struct.pack("<IIQ", ARRAY, UINT32, 2**61)]),
                                 r"array of \d+ UINT32 elements needs more bytes"),
    "string array count huge": (build_raw([gstr("k") + struct.pack("<IIQ", ARRAY, STRING, 2**40)]),
                                r"array of \d+ STRING elements cannot fit"),
    "string in array truncated": (_hdr(n_kv=1) + gstr("k") + struct.pack("<IIQ", ARRAY, STRING, 2) + gstr("ok")
                                  + struct.pack("<Q", 50) + b"abc", r"string value length 50 exceeds"),
    "arrays nested too deep": (build_raw([_nested(6)]), r"nested deeper than"),
    "bool value 2": (build_raw([gstr("b") + struct.pack("<IB", BOOL, 2)]), r"BOOL value is 2"),
    "bool array element 7": (build_raw([gstr("b") + struct.pack("<IIQ", ARRAY, BOOL, 3) + b"\x01\x00\x07"]),
                             r"BOOL array element 2 is 7"),
    "string value length past end": (_hdr(n_kv=1) + gstr("s") + struct.pack("<IQ", STRING, 1000) + b"abc",
                                     r"string value length 1000 exceeds"),
    "alignment wrong type": (build_raw([kv("general.alignment", UINT64, 32)]), r"general.alignment must be UINT32"),
    "alignment not power of two": (build_raw([kv("general.alignment", UINT32, 48)]), r"48 is not a power of two"),
    "alignment zero": (build_raw([kv("general.alignment", UINT32, 0)]), r"0 is not a power of two"),
    "truncated scalar value": (_hdr(n_kv=1) + gstr("k") + struct.pack("<I", UINT64) + b"\0\0", r"truncated.*metadata value"),
    "empty tensor name": (build_raw([], [_f32_info(name="")], bytes(128)), r"name length 0 is outside"),
    "tensor name 64 bytes": (build_raw([], [_f32_info(name="n" * 64)], bytes(128)), r"name length 64 is outside"),
    "duplicate tensor names": (build_raw([], [_f32_info("t"), _f32_info("t", off=128)], bytes(256)),
                               r"duplicate tensor name 't'"),
    "zero dims": (build_raw([], [gstr("a") + struct.pack("<IIQ", 0, 0, 0)], bytes(32)), r"has 0 dimensions"),
    "five dims": (build_raw([], [_f32_info(ne=(1, 1, 1, 1, 1))], bytes(32)), r"has 5 dimensions"),
    "zero-length dimension": (build_raw([], [_f32_info(ne=(32, 0))], bytes(128)), r"dimension 1 is 0"),
    "dimension >= 2^63": (build_raw([], [_f32_info(ne=(2**63,))], bytes(128)), r"dimension 0 is"),
    "element count overflow": (build_raw([], [_f32_info(ne=(2**32, 2**32))], bytes(128)), r"element count overflows"),
    "removed type id 4": (build_raw([], [_f32_info(gt=4)], bytes(128)), r"unknown ggml type id 4"),
    "unknown type id 99": (build_raw([], [_f32_info(gt=99)], bytes(128)), r"unknown ggml type id 99"),
    "row not a block multiple": (build_raw([], [_f32_info(ne=(40,), gt=2)], bytes(128)),
                                 r"row length 40 is not a multiple of Q4_0's block size 32"),
    "misaligned offset": (build_raw([], [_f32_info(off=4)], bytes(256)), r"offset 4 is not a multiple of the alignment 32"),
    "overlapping tensors": (build_raw([], [_f32_info("a", ne=(64,)), _f32_info("b", off=128)], bytes(512)),
                            r"'b' data overlaps tensor 'a'"),
    "data past end": (build_raw([], [_f32_info(ne=(64,))], bytes(100)), r"'a' data .* runs past the end"),
    "huge offset": (build_raw([], [_f32_info(off=2**63)], bytes(128)), r"'a' data .* runs past the end"),
    "truncated mid tensor info": (_hdr(n_t=1) + gstr("a" * 30) + struct.pack("<IQ", 2, 32) + b"\0\0", r"truncated.*tensor dimension"),
    "no data section": (_hdr(n_t=1) + _f32_info(), r"data section|runs past the end"),
}


@pytest.mark.parametrize("case", sorted(CORRUPT), ids=lambda c: c.replace(" ", "-"))
def test_corrupt_file_raises_named_gguf_error(tmp_path, case):
    data, pattern = CORRUPT[case]
    p = write(tmp_path, data)
    with pytest.raises(orkpy.GGUFError, match=pattern) as e:
        orkpy.GGUFFile(p)
    msg = str(e.value)
    assert str(p) in msg and "byte offset" in msg
    assert isinstance(e.value, ValueError) and isinstance(e.value, orkpy.FormatError)


def test_corrupt_suite_is_large_enough():
    assert len(CORRUPT) >= 30


def test_truncation_at_every_structural_boundary(tmp_path):
    data, layout, _ = small_valid_file()
    g = gguf.GGUFReader(write(tmp_path, data, "ref.gguf"))
    cuts = {0, 2, 4, 6, 8, 12, 16, 20, 24}
    for f in g.fields.values():          # the start and end of every key/value
        cuts.add(int(f.offset))
        cuts.add(int(f.offset) + int(sum(p.nbytes for p in f.parts)))
    for t in g.tensors:                  # every tensor's data start and end
        cuts.add(int(t.data_offset))
        cuts.add(int(t.data_offset) + int(t.n_bytes))
    cuts |= {layout["infos_end"], layout["data_start"]}
    cuts |= {c - 1 for c in list(cuts)} | {c + 1 for c in list(cuts)}
    cuts = sorted(c for c in cuts if 0 <= c < len(data))
    assert len(cuts) > 60
    for c in cuts:
        p = write(tmp_path, data[:c], "cut.gguf")
        with pytest.raises(orkpy.GGUFError, match="byte offset"):
            orkpy.GGUFFile(p)


def test_real_file_truncated_anywhere(shared, tmp_path):
    path = shared / "models/stories260K/stories260K-Q4_K_M.gguf"
    data = path.read_bytes()
    with orkpy.GGUFFile(path) as g:  # llama.cpp pads the file after the last tensor
        end = max(t.data_offset + t.nbytes for t in g.tensors)
    assert end < len(data)
    orkpy.GGUFFile(write(tmp_path, data[:end], "exact.gguf")).close()  # padding is optional
    for c in np.linspace(0, end - 1, 97).astype(int):
        p = write(tmp_path, data[:c], "cut.gguf")
        with pytest.raises(orkpy.GGUFError):
            orkpy.GGUFFile(p)


def test_random_byte_flips_never_crash(shared, tmp_path):
    """Flipped header bytes either still parse or raise GGUFError: nothing else."""
    data = bytearray((shared / "models/stories260K/stories260K-Q4_0.gguf").read_bytes())
    rng = np.random.default_rng(0)
    head = orkpy.GGUFFile(shared / "models/stories260K/stories260K-Q4_0.gguf").data_offset
    outcomes = {"ok": 0, "error": 0}
    for _ in range(300):
        d = bytearray(data)
        for pos in rng.integers(0, head, size=3):
            d[pos] = rng.integers(0, 256)
        p = write(tmp_path, bytes(d), "flip.gguf")
        try:
            orkpy.GGUFFile(p).close()
            outcomes["ok"] += 1
        except orkpy.GGUFError:
            outcomes["error"] += 1
    assert outcomes["error"] > 0


def test_missing_file_is_oserror(tmp_path):
    with pytest.raises(FileNotFoundError):
        orkpy.GGUFFile(tmp_path / "nope.gguf")
