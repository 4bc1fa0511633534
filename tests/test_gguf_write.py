"""The GGUF v3 writer: round trips through orkpy's strict reader and gguf-py's
GGUFReader for every shared model's metadata, byte identity with gguf-py's own
writer, alignment/padding, atomic writes and a bad-input suite."""
import os
import struct

import numpy as np
import pytest

import orkpy
from orkpy.formats.gguf_write import LazyTensor, metadata_triples, write_gguf

gguf = pytest.importorskip("gguf")


def _model_files(shared):
    files = sorted(shared.glob("models/*/*.gguf"))
    assert len(files) >= 5, "expected the shared GGUF models"
    return files


def _assert_meta_equal(a, b):
    """a, b: metadata triples lists; order, types and values equal (arrays: dtype too)."""
    assert [k for k, _, _ in a] == [k for k, _, _ in b]
    for (k, ta, va), (_, tb, vb) in zip(a, b):
        assert ta == tb, k
        _assert_value_equal(va, vb, k)


def _assert_value_equal(va, vb, k):
    if isinstance(va, np.ndarray):
        assert isinstance(vb, np.ndarray) and va.dtype == vb.dtype and np.array_equal(va, vb), k
    elif isinstance(va, list):
        assert isinstance(vb, list) and len(va) == len(vb), k
        for x, y in zip(va, vb):
            _assert_value_equal(x, y, k)
    else:
        assert type(va) is type(vb) and va == vb, k


# ------------------------------------------------------------------ round trips --

def test_round_trip_every_shared_model(tmp_path, shared):
    for src in _model_files(shared):
        with orkpy.GGUFFile(src) as g:
            meta = metadata_triples(g)
            # a few real tensors as F32 and F16, plus a 3-D and a 4-D one
            picks = [t.name for t in g.tensors if t.ndim == 2][:2] + [t.name for t in g.tensors if t.ndim == 1][:1]
            tensors = [(n, g.tensor(n)) for n in picks]
        tensors.append((picks[0] + ".f16", tensors[0][1].astype(np.float16)))
        tensors.append(("t3d", np.arange(2 * 3 * 5, dtype=np.float32).reshape(2, 3, 5)))
        tensors.append(("t4d", np.linspace(-1, 1, 2 * 1 * 3 * 7).astype(np.float16).reshape(2, 1, 3, 7)))
        out = tmp_path / ("rt-" + src.name)
        write_gguf(out, meta, tensors)
        with orkpy.GGUFFile(out) as h:
            assert h.version == 3 and h.alignment == 32
            _assert_meta_equal(meta, metadata_triples(h))
            assert [t.name for t in h.tensors] == [n for n, _ in tensors]
            for n, a in tensors:
                ti = h.tensor_info(n)
                assert ti.shape == a.shape and ti.type == ("F16" if a.dtype == np.float16 else "F32")
                assert ti.data_offset % 32 == 0
                assert h.raw(n).tobytes() == a.tobytes()
                assert np.array_equal(h.tensor(n), a.astype(np.float32))
            assert os.path.getsize(out) % 32 == 0  # the last tensor is padded too
        # gguf-py reads it: same keys, values, tensor names, ne shapes and data
        r = gguf.GGUFReader(out)
        fields = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}
        assert list(fields) == [k for k, _, _ in meta]
        for k, t, v in meta:
            got = fields[k].contents()
            if isinstance(v, np.ndarray):
                assert np.array_equal(np.asarray(got, dtype=v.dtype), v), k
            elif t == "FLOAT32":
                assert np.float32(got) == np.float32(v), k
            else:
                assert got == v, k
        rt = {t.name: t for t in r.tensors}
        for n, a in tensors:
            assert list(rt[n].shape) == list(reversed(a.shape))
            assert np.array_equal(np.asarray(rt[n].data).reshape(a.shape), a)


def test_metadata_triples_from_a_path(shared):
    src = _model_files(shared)[0]
    with orkpy.GGUFFile(src) as g:
        assert [k for k, _, _ in metadata_triples(src)] == list(g.metadata)
    with pytest.raises(TypeError, match="GGUFFile or a path"):
        metadata_triples(42)


def test_byte_identical_to_gguf_py_writer(tmp_path):
    t1 = np.arange(12, dtype=np.float32).reshape(3, 4)
    t2 = np.ones(5, np.float16)
    w = gguf.GGUFWriter(str(tmp_path / "a.gguf"), "llama")
    w.add_uint32("x.u", 5)
    w.add_string("x.s", "h\u00e9")
    w.add_array("x.arr", ["a", "bc"])
    w.add_float32("x.f", 1.5)
    w.add_bool("x.b", True)
    w.add_tensor("t1", t1)
    w.add_tensor("t2", t2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    write_gguf(tmp_path / "b.gguf",
               [("general.architecture", "STRING", "llama"), ("x.u", "UINT32", 5), ("x.s", "STRING", "h\u00e9"),
                ("x.arr", "ARRAY", ["a", "bc"]), ("x.f", "FLOAT32", 1.5), ("x.b", "BOOL", True)],
               [("t1", t1), ("t2", t2)])
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()


def test_every_value_type_and_nested_arrays(tmp_path):
    meta = [
        ("t.u8", "UINT8", 255), ("t.i8", "INT8", -128), ("t.u16", "UINT16", 65535), ("t.i16", "INT16", -32768),
        ("t.u32", "UINT32", 2**32 - 1), ("t.i32", "INT32", -2**31), ("t.f32", "FLOAT32", 0.1),
        ("t.bool", "BOOL", False), ("t.str", "STRING", "\u00e9\u4e2d"), ("t.empty", "STRING", ""),
        ("t.u64", "UINT64", 2**64 - 1), ("t.i64", "INT64", np.int64(-2**63)), ("t.f64", "FLOAT64", 1e300),
        ("t.strs", "ARRAY", ["a", "", "\u00e9"]), ("t.nostrs", "ARRAY", []),
        ("t.nested", "ARRAY", [np.array([1, 2], np.uint8), ["x", "y"], [np.array([True, False])]]),
        ("t.bools", "ARRAY", np.array([True, False, True])),
        ("t.big_endian", "ARRAY", np.array([1, 2, 3], dtype=">u4")),
    ]
    for dt in ("u1", "i1", "u2", "i2", "u4", "i4", "f4", "u8", "i8", "f8"):
        meta.append((f"t.arr_{dt}", "ARRAY", (np.arange(5) - (0 if dt[0] == "u" else 2)).astype(dt)))
    write_gguf(tmp_path / "v.gguf", meta, [])
    with orkpy.GGUFFile(tmp_path / "v.gguf") as g:
        m = g.metadata
        assert len(g.tensors) == 0 and list(m) == [k for k, _, _ in meta]
        assert (m["t.u8"], m["t.i8"], m["t.u16"], m["t.i16"]) == (255, -128, 65535, -32768)
        assert (m["t.u32"], m["t.i32"], m["t.u64"], m["t.i64"]) == (2**32 - 1, -2**31, 2**64 - 1, -2**63)
        assert m["t.f32"] == float(np.float32(0.1)) and m["t.f64"] == 1e300 and m["t.bool"] is False
        assert m["t.str"] == "\u00e9\u4e2d" and m["t.empty"] == ""
        assert m["t.strs"] == ["a", "", "\u00e9"] and m["t.nostrs"] == []
        assert m["t.nested"][0].dtype == np.uint8 and m["t.nested"][1] == ["x", "y"]
        assert m["t.nested"][2][0].dtype == np.bool_ and m["t.nested"][2][0].tolist() == [True, False]
        assert m["t.bools"].dtype == np.bool_ and m["t.bools"].tolist() == [True, False, True]
        assert m["t.big_endian"].dtype == np.uint32 and m["t.big_endian"].tolist() == [1, 2, 3]
        for dt in ("u1", "i1", "u2", "i2", "u4", "i4", "f4", "u8", "i8", "f8"):
            a = m[f"t.arr_{dt}"]
            assert a.dtype == np.dtype(dt) and a.tolist() == (np.arange(5) - (0 if dt[0] == "u" else 2)).tolist()
        assert g.metadata_types["t.nested"] == "ARRAY" and g.metadata_types["t.i64"] == "INT64"


def test_layout_alignment_and_padding(tmp_path):
    a = np.arange(3, dtype=np.float32)           # 12 bytes
    b = np.arange(5, dtype=np.float16)           # 10 bytes
    write_gguf(tmp_path / "a.gguf", [("general.architecture", "STRING", "llama")], [("a", a), ("b", b)])
    data = (tmp_path / "a.gguf").read_bytes()
    assert data[:4] == b"GGUF" and struct.unpack_from("<IQQ", data, 4) == (3, 2, 1)
    with orkpy.GGUFFile(tmp_path / "a.gguf") as g:
        assert g.data_offset % 32 == 0 and [t.offset for t in g.tensors] == [0, 32]
        assert len(data) == g.data_offset + 64
        assert data[g.data_offset + 12:g.data_offset + 32] == bytes(20)  # zero padding
    # a non-default alignment is recorded as general.alignment (and must agree when given)
    write_gguf(tmp_path / "b.gguf", [], [("a", a), ("b", b)], alignment=64)
    with orkpy.GGUFFile(tmp_path / "b.gguf") as g:
        assert g.alignment == 64 and g.metadata["general.alignment"] == 64
        assert g.metadata_types["general.alignment"] == "UINT32"
        assert [t.offset for t in g.tensors] == [0, 64] and g.data_offset % 64 == 0
        assert np.array_equal(g.tensor("b"), b.astype(np.float32))
    assert gguf.GGUFReader(tmp_path / "b.gguf").alignment == 64
    write_gguf(tmp_path / "c.gguf", [("general.alignment", "UINT32", 64)], [("a", a)], alignment=64)
    assert orkpy.GGUFFile(tmp_path / "c.gguf").alignment == 64
    with pytest.raises(ValueError, match="general.alignment"):
        write_gguf(tmp_path / "d.gguf", [("general.alignment", "UINT32", 64)], [("a", a)])
    with pytest.raises(ValueError, match="general.alignment must be UINT32"):
        write_gguf(tmp_path / "d.gguf", [("general.alignment", "UINT64", 32)], [("a", a)])


def test_non_contiguous_and_big_endian_tensors(tmp_path):
    base = np.arange(64, dtype=np.float32).reshape(8, 8)
    t = base.T                                   # non-contiguous view
    be = base.astype(">f4")                      # big-endian
    write_gguf(tmp_path / "n.gguf", [], [("t", t), ("be", be)])
    with orkpy.GGUFFile(tmp_path / "n.gguf") as g:
        assert np.array_equal(g.tensor("t"), t) and np.array_equal(g.tensor("be"), base)


def test_atomic_write_keeps_old_file_on_error(tmp_path):
    p = tmp_path / "keep.gguf"
    write_gguf(p, [("general.architecture", "STRING", "llama")], [("a", np.ones(4, np.float32))])
    before = p.read_bytes()
    with pytest.raises(TypeError):
        write_gguf(p, [("general.architecture", "STRING", 3)], [])
    assert p.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["keep.gguf"]  # no temp file left behind


# ------------------------------------------------------------------ bad inputs --

A = np.ones(4, np.float32)


@pytest.mark.parametrize("meta, tensors, exc, match", [
    ([("k", "UINT128", 1)], [], ValueError, "unknown GGUF value type 'UINT128'"),
    ([("k", "uint32", 1)], [], ValueError, "unknown GGUF value type"),
    ([("k", "UINT32", "1")], [], TypeError, "UINT32 value must be an int"),
    ([("k", "UINT32", 1.0)], [], TypeError, "UINT32 value must be an int"),
    ([("k", "UINT32", True)], [], TypeError, "UINT32 value must be an int"),
    ([("k", "UINT32", -1)], [], ValueError, "out of range for UINT32"),
    ([("k", "UINT8", 256)], [], ValueError, "out of range for UINT8"),
    ([("k", "INT64", 2**63)], [], ValueError, "out of range for INT64"),
    ([("k", "FLOAT32", "x")], [], TypeError, "FLOAT32 value must be a real number"),
    ([("k", "FLOAT32", 1e39)], [], ValueError, "overflows FLOAT32"),
    ([("k", "BOOL", 1)], [], TypeError, "BOOL value must be bool"),
    ([("k", "STRING", b"bytes")], [], TypeError, "expected str"),
    ([("k", "ARRAY", [1, 2, 3])], [], TypeError, "explicit dtype"),
    ([("k", "ARRAY", ["a", 1])], [], TypeError, "list elements"),
    ([("k", "ARRAY", np.zeros((2, 2), np.int32))], [], ValueError, "must be 1-D"),
    ([("k", "ARRAY", np.zeros(2, np.float16))], [], TypeError, "dtype float16"),
    ([("k", "ARRAY", np.array(["a"]))], [], TypeError, "has no GGUF element type"),
    ([("k", "ARRAY", "abc")], [], TypeError, "ARRAY value must be"),
    ([("k", "ARRAY", [[[[[["x"]]]]]])], [], ValueError, "nested deeper"),
    ([("k", "UINT32", 1), ("k", "UINT32", 2)], [], ValueError, "duplicate metadata key 'k'"),
    ([("", "UINT32", 1)], [], ValueError, "empty key"),
    ([(7, "UINT32", 1)], [], TypeError, "key must be str"),
    ([("k", "UINT32")], [], TypeError, "triple"),
    ([], [("a", A), ("a", A)], ValueError, "duplicate tensor name 'a'"),
    ([], [("a", A.astype(np.float64))], TypeError, "tensor 'a': dtype float64"),
    ([], [("a", np.ones(4, np.int32))], TypeError, "tensor 'a': dtype int32"),
    ([], [("a", [1.0, 2.0])], TypeError, "expected a NumPy array"),
    ([], [("a", np.array(1.0, np.float32))], ValueError, "0 dimensions"),
    ([], [("a", np.ones((1, 1, 1, 1, 2), np.float32))], ValueError, "5 dimensions"),
    ([], [("a", np.ones((0, 4), np.float32))], ValueError, "zero dimension"),
    ([], [("x" * 64, A)], ValueError, "64 bytes"),
    ([], [("", A)], ValueError, "0 bytes"),
    ([], [(3, A)], TypeError, "name must be str"),
    ([], [("a",)], TypeError, "pair"),
])
def test_bad_inputs(tmp_path, meta, tensors, exc, match):
    with pytest.raises(exc, match=match):
        write_gguf(tmp_path / "bad.gguf", meta, tensors)
    assert not (tmp_path / "bad.gguf").exists()


@pytest.mark.parametrize("alignment", [0, 4, 24, 33, -32, 32.0, "32"])
def test_bad_alignment(tmp_path, alignment):
    with pytest.raises(ValueError, match="alignment must be a power of two"):
        write_gguf(tmp_path / "bad.gguf", [], [], alignment=alignment)


def test_metadata_must_be_a_list(tmp_path):
    with pytest.raises(TypeError, match="list of"):
        write_gguf(tmp_path / "bad.gguf", {"k": 1}, [])


def test_direct_write_and_digest(tmp_path):
    """write_gguf(direct=True, digest=True): the same bytes as a plain write (tensor data past the
    page cache, header through it), and the returned SHA-256 is the file's."""
    import hashlib
    rng = np.random.default_rng(3)
    meta = [("general.architecture", "STRING", "llama"), ("general.name", "STRING", "direct")]
    tensors = [("a", rng.standard_normal((700, 1001)).astype(np.float32)),
               ("b", rng.standard_normal(5).astype(np.float16)),
               ("c", LazyTensor((300, 64), np.float16, lambda: np.full((300, 64), 1.5, np.float16)))]
    assert write_gguf(tmp_path / "plain.gguf", meta, tensors) is None
    got = write_gguf(tmp_path / "direct.gguf", meta, tensors, direct=True, digest=True)
    data = (tmp_path / "direct.gguf").read_bytes()
    assert data == (tmp_path / "plain.gguf").read_bytes() and len(data) > (1 << 20)
    assert got == hashlib.sha256(data).hexdigest()
