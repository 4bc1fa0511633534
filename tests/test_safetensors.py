"""The strict safetensors reader: round trips, no-copy memmaps, BF16, directories,
sharded indexes with config.json, and broken files (each must raise
SafetensorsError naming the file, the tensor and the problem). Files are built
by hand here; when the official ``safetensors`` package is installed, its
writer and its reader are cross-checked too (it is not a dependency)."""
import json
import struct

import numpy as np
import pytest

import orkpy
from orkpy.formats.safetensors import SafetensorsModel

ST_DTYPE = {
    np.dtype("float32"): "F32", np.dtype("float16"): "F16", np.dtype("float64"): "F64",
    np.dtype("int8"): "I8", np.dtype("int16"): "I16", np.dtype("int32"): "I32",
    np.dtype("int64"): "I64", np.dtype("uint8"): "U8", np.dtype("uint16"): "U16",
    np.dtype("uint32"): "U32", np.dtype("uint64"): "U64", np.dtype("bool"): "BOOL",
    np.dtype("complex64"): "C64",
}


def build(tensors, metadata=None, raw_header=None, pad=True, extra=b""):
    """Bytes of a safetensors file.

    ``tensors``: name -> numpy array, or name -> (dtype string, shape, raw bytes)
    for dtypes numpy lacks (BF16). Data is laid out in dict order. ``raw_header``
    replaces the JSON header bytes verbatim; ``extra`` is appended after the data.
    """
    header, chunks, pos = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, t in tensors.items():
        if isinstance(t, tuple):
            dtype, shape, data = t
        else:
            a = np.asarray(t)
            dtype, shape, data = ST_DTYPE[a.dtype], list(a.shape), a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + len(data)]}
        chunks.append(data)
        pos += len(data)
    h = raw_header if raw_header is not None else json.dumps(header).encode()
    if pad and raw_header is None:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(chunks) + extra


def write(path, *args, **kw):
    path.write_bytes(build(*args, **kw))
    return path


def header_file(path, header, data=b""):
    """A file with the given header dict (written verbatim, offsets untouched)."""
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)
    return path


def bf16_bits_to_f32_reference(bits):
    """Independent BF16 -> float32: per element, via struct."""
    flat = [struct.unpack("<f", struct.pack("<I", int(b) << 16))[0] for b in bits.ravel()]
    return np.array(flat, dtype=np.float32).reshape(bits.shape)


def base_memmap(a):
    """The np.memmap at the end of a's .base chain, or None."""
    while isinstance(a, np.ndarray):
        if isinstance(a, np.memmap):
            return a
        a = a.base
    return None


def memmap_in_base_chain(a):
    return base_memmap(a) is not None


# ------------------------------------------------------------- round trips --

def test_f32_f16_round_trip_exact(tmp_path, rng):
    w = rng.standard_normal((7, 5)).astype(np.float32)
    w[0, :4] = [np.inf, -np.inf, -0.0, np.float32(1e-45)]
    h = rng.standard_normal((3, 4, 2)).astype(np.float16)
    h[0, 0, 0] = np.float16(6e-8)
    p = write(tmp_path / "a.safetensors", {"w": w, "h": h})
    m = orkpy.load_safetensors(p)
    assert isinstance(m, SafetensorsModel) and isinstance(m, dict)
    assert list(m) == ["w", "h"]
    assert m["w"].dtype == np.float32 and m["w"].shape == (7, 5)
    assert m["h"].dtype == np.float16 and m["h"].shape == (3, 4, 2)
    assert m["w"].tobytes() == w.tobytes() and m["h"].tobytes() == h.tobytes()
    assert np.signbit(m["w"][0, 2])
    assert m.config is None and m.metadata == {}


def test_nan_payloads_survive(tmp_path):
    bits = np.array([0x7FC00001, 0xFFC12345, 0x7F800001], dtype=np.uint32)
    p = write(tmp_path / "n.safetensors", {"x": bits.view(np.float32)})
    assert orkpy.load_safetensors(p)["x"].view(np.uint32).tolist() == bits.tolist()


def test_f32_is_a_read_only_view_of_a_memmap(tmp_path, rng):
    w = rng.standard_normal((16, 8)).astype(np.float32)
    p = write(tmp_path / "w.safetensors", {"pad": np.zeros(3, np.uint8), "w": w, "h": w.astype(np.float16)})
    m = orkpy.load_safetensors(p)
    for name in ("w", "h"):
        a = m[name]
        mm = base_memmap(a)
        assert mm is not None, name
        assert type(a) is np.ndarray  # a plain array, viewing the memmap
        assert mm.filename == str(p.resolve()) and np.shares_memory(a, mm)
        assert not a.flags.writeable and not a.flags.owndata
        with pytest.raises(ValueError):
            a[0, 0] = 1
    # the data sits in the file where the header says: overwrite the file, the view sees it
    p_bytes = bytearray(p.read_bytes())
    n = struct.unpack("<Q", p_bytes[:8])[0]
    off = 8 + n + 3
    p_bytes[off:off + 4] = struct.pack("<f", 42.0)
    with open(p, "r+b") as f:
        f.write(bytes(p_bytes))
    assert m["w"][0, 0] == 42.0


def test_bf16_converts_exactly_to_f32(tmp_path, rng):
    bits = rng.integers(0, 2**16, size=(6, 9), dtype=np.uint16)
    bits.ravel()[:8] = [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x0001, 0x3F80, 0xC0A0]
    p = write(tmp_path / "b.safetensors",
              {"b": ("BF16", bits.shape, bits.astype("<u2").tobytes()), "f": np.ones(2, np.float32)})
    m = orkpy.load_safetensors(p)
    b = m["b"]
    ref = bf16_bits_to_f32_reference(bits)
    assert b.dtype == np.float32 and b.shape == (6, 9)
    assert b.view(np.uint32).tolist() == ref.view(np.uint32).tolist()  # bit-exact, NaNs included
    assert b.ravel()[6] == 1.0 and b.ravel()[7] == -5.0 and np.isinf(b.ravel()[2])
    assert not b.flags.writeable
    assert list(m) == ["b", "f"]


def test_other_dtypes_round_trip(tmp_path, rng):
    arrs = {
        "i8": rng.integers(-128, 128, 10).astype(np.int8),
        "u8": rng.integers(0, 256, 10).astype(np.uint8),
        "i16": rng.integers(-2**15, 2**15, 5).astype(np.int16),
        "u16": rng.integers(0, 2**16, 5).astype(np.uint16),
        "i32": rng.integers(-2**31, 2**31, (2, 3)).astype(np.int32),
        "u32": rng.integers(0, 2**32, 3, dtype=np.uint64).astype(np.uint32),
        "i64": np.array([-2**63, 2**63 - 1, 0], np.int64),
        "u64": np.array([2**64 - 1, 0], np.uint64),
        "f64": rng.standard_normal((2, 2)),
        "c64": (rng.standard_normal(3) + 1j * rng.standard_normal(3)).astype(np.complex64),
        "bool": np.array([True, False, True]),
    }
    p = write(tmp_path / "o.safetensors", arrs)
    m = orkpy.load_safetensors(p)
    assert list(m) == list(arrs)
    for k, a in arrs.items():
        assert m[k].dtype == a.dtype and m[k].shape == a.shape, k
        assert np.array_equal(m[k], a), k
        assert not m[k].flags.writeable


def test_scalar_empty_and_header_order(tmp_path):
    tensors = {"zeta": np.float32(3.5).reshape(()), "empty": np.zeros((0, 4), np.float32),
               "alpha": np.arange(4, dtype=np.int32), "nothing": np.zeros(0, np.float16)}
    p = write(tmp_path / "s.safetensors", tensors, metadata={"format": "pt", "x": "y"})
    m = orkpy.load_safetensors(str(p))
    assert list(m) == ["zeta", "empty", "alpha", "nothing"]
    assert m["zeta"].shape == () and m["zeta"] == 3.5
    assert m["empty"].shape == (0, 4) and m["nothing"].shape == (0,)
    assert m.metadata == {"format": "pt", "x": "y"}


def test_empty_checkpoint_and_unpadded_header(tmp_path):
    p = tmp_path / "e.safetensors"
    p.write_bytes(struct.pack("<Q", 2) + b"{}")
    assert dict(orkpy.load_safetensors(p)) == {}
    q = write(tmp_path / "u.safetensors", {"a": np.arange(3, dtype=np.float32)}, pad=False)
    assert orkpy.load_safetensors(q)["a"].tolist() == [0.0, 1.0, 2.0]  # unaligned data is fine


# ------------------------------------------------------- directory, sharded --

CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 8, "num_hidden_layers": 2}


def test_directory_with_model_and_config(tmp_path):
    write(tmp_path / "model.safetensors", {"a": np.arange(4, dtype=np.float32)}, metadata={"format": "pt"})
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    m = orkpy.load_safetensors(tmp_path)
    assert m.config == CONFIG and m.metadata == {"format": "pt"}
    assert m["a"].tolist() == [0, 1, 2, 3]
    assert m.files == (str((tmp_path / "model.safetensors").resolve()),)


def test_directory_without_config(tmp_path):
    write(tmp_path / "model.safetensors", {"a": np.arange(4, dtype=np.float32)})
    assert orkpy.load_safetensors(str(tmp_path)).config is None


def make_sharded(d, config=True):
    rng = np.random.default_rng(7)
    s1 = {"embed": rng.standard_normal((4, 3)).astype(np.float32),
          "l0.w": rng.standard_normal((3, 3)).astype(np.float16)}
    s2 = {"l1.w": rng.standard_normal((3, 3)).astype(np.float32),
          "norm": ("BF16", (3,), np.array([0x3F80, 0x4000, 0xBF80], "<u2").tobytes())}
    write(d / "model-00001-of-00002.safetensors", s1, metadata={"format": "pt"})
    write(d / "model-00002-of-00002.safetensors", s2, metadata={"format": "pt", "shard": "2"})
    wm = {"embed": "model-00001-of-00002.safetensors", "l0.w": "model-00001-of-00002.safetensors",
          "l1.w": "model-00002-of-00002.safetensors", "norm": "model-00002-of-00002.safetensors"}
    index = {"metadata": {"total_size": 123}, "weight_map": wm}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    if config:
        (d / "config.json").write_text(json.dumps(CONFIG))
    return s1, s2, index


def test_sharded_index_with_config(tmp_path):
    s1, s2, _ = make_sharded(tmp_path)
    for arg in (tmp_path / "model.safetensors.index.json", tmp_path):
        m = orkpy.load_safetensors(arg)
        assert list(m) == ["embed", "l0.w", "l1.w", "norm"]
        assert m.config == CONFIG
        assert m.index_metadata == {"total_size": 123}
        assert m.metadata == {"format": "pt", "shard": "2"}
        assert m.shard_metadata["model-00002-of-00002.safetensors"] == {"format": "pt", "shard": "2"}
        assert len(m.files) == 2
        assert np.array_equal(m["embed"], s1["embed"]) and np.array_equal(m["l1.w"], s2["l1.w"])
        assert m["l0.w"].dtype == np.float16 and memmap_in_base_chain(m["l0.w"])
        assert m["norm"].tolist() == [1.0, 2.0, -1.0]


def test_sharded_index_without_config(tmp_path):
    make_sharded(tmp_path, config=False)
    assert orkpy.load_safetensors(tmp_path / "model.safetensors.index.json").config is None


def edit_index(d, fn):
    p = d / "model.safetensors.index.json"
    idx = json.loads(p.read_text())
    fn(idx)
    p.write_text(json.dumps(idx))
    return p


def test_sharded_missing_shard_file(tmp_path):
    make_sharded(tmp_path)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(orkpy.SafetensorsError, match=r"index\.json: shard file 'model-00002-of-00002.safetensors' .*does not exist"):
        orkpy.load_safetensors(tmp_path)


def test_sharded_tensor_not_in_its_shard(tmp_path):
    make_sharded(tmp_path)
    p = edit_index(tmp_path, lambda i: i["weight_map"].update({"ghost": "model-00001-of-00002.safetensors"}))
    with pytest.raises(orkpy.SafetensorsError, match=r"tensor 'ghost': weight_map maps tensor to shard 'model-00001-of-00002.safetensors', which has no such tensor"):
        orkpy.load_safetensors(p)


def test_sharded_tensor_mapped_to_wrong_shard(tmp_path):
    make_sharded(tmp_path)
    p = edit_index(tmp_path, lambda i: i["weight_map"].update({"l0.w": "model-00002-of-00002.safetensors"}))
    with pytest.raises(orkpy.SafetensorsError, match=r"tensor 'l0.w': tensor is in shard 'model-00001-of-00002.safetensors' but the weight_map maps it to 'model-00002"):
        orkpy.load_safetensors(p)


def test_sharded_duplicate_tensor_across_shards(tmp_path):
    make_sharded(tmp_path)
    write(tmp_path / "model-00002-of-00002.safetensors",
          {"l1.w": np.zeros((3, 3), np.float32), "embed": np.zeros(1, np.float32),
           "norm": ("BF16", (3,), b"\0" * 6)})
    with pytest.raises(orkpy.SafetensorsError, match=r"tensor 'embed': duplicate tensor name: in shard 'model-00001-of-00002.safetensors' and in shard 'model-00002-of-00002.safetensors'"):
        orkpy.load_safetensors(tmp_path)


def test_sharded_unlisted_tensor(tmp_path):
    make_sharded(tmp_path)
    p = edit_index(tmp_path, lambda i: i["weight_map"].pop("norm"))
    with pytest.raises(orkpy.SafetensorsError, match=r"tensor 'norm': tensor in shard 'model-00002-of-00002.safetensors' is not listed in the weight_map"):
        orkpy.load_safetensors(p)


@pytest.mark.parametrize("shard", ["../model-00001-of-00002.safetensors", "/etc/passwd", "sub/x.safetensors", "", ".."])
def test_sharded_shard_must_be_a_plain_file_name(tmp_path, shard):
    make_sharded(tmp_path)
    p = edit_index(tmp_path, lambda i: i["weight_map"].update({"embed": shard}))
    with pytest.raises(orkpy.SafetensorsError, match=r"tensor 'embed': shard .* must be a plain file name"):
        orkpy.load_safetensors(p)


@pytest.mark.parametrize("text, match", [
    ('{"weight_map": {"a": "x.safetensors"}, "weight_map": {}}', r"index has duplicate key 'weight_map'"),
    ('{"weight_map": {"a": "x.safetensors", "a": "y.safetensors"}}', r"index has duplicate key 'a'"),
    ('{"metadata": {}}', r"index has no weight_map"),
    ('{"weight_map": []}', r"weight_map must be an object"),
    ('{"weight_map": {}}', r"weight_map is empty"),
    ('{"weight_map": {"a": 3}}', r"tensor 'a': weight_map value must be a file name, got 3"),
    ('{"weight_map": {"a": "x"}, "metadata": [1]}', r"index metadata must be an object"),
    ('[1, 2]', r"index is not a JSON object"),
    ('{"weight_map": ', r"index is not valid JSON"),
])
def test_bad_index(tmp_path, text, match):
    p = tmp_path / "model.safetensors.index.json"
    p.write_text(text)
    with pytest.raises(orkpy.SafetensorsError, match=r"model\.safetensors\.index\.json: " + match):
        orkpy.load_safetensors(p)


def test_bad_config(tmp_path):
    write(tmp_path / "model.safetensors", {"a": np.zeros(1, np.float32)})
    (tmp_path / "config.json").write_text('{"a": 1, "a": 2}')
    with pytest.raises(orkpy.SafetensorsError, match=r"config\.json: config has duplicate key 'a'"):
        orkpy.load_safetensors(tmp_path)
    (tmp_path / "config.json").write_text('{"a": NaN}')
    with pytest.raises(orkpy.SafetensorsError, match=r"config\.json: config is not valid JSON"):
        orkpy.load_safetensors(tmp_path)
    (tmp_path / "config.json").write_text('"x"')
    with pytest.raises(orkpy.SafetensorsError, match=r"config\.json: config is not a JSON object"):
        orkpy.load_safetensors(tmp_path)


def test_bad_paths(tmp_path):
    with pytest.raises(orkpy.SafetensorsError, match=r"nope\.safetensors: no such file"):
        orkpy.load_safetensors(tmp_path / "nope.safetensors")
    with pytest.raises(orkpy.SafetensorsError, match=r"holds neither model\.safetensors nor"):
        orkpy.load_safetensors(tmp_path)
    make_sharded(tmp_path)
    write(tmp_path / "model.safetensors", {"a": np.zeros(1, np.float32)})
    with pytest.raises(orkpy.SafetensorsError, match=r"holds both model\.safetensors and"):
        orkpy.load_safetensors(tmp_path)
    with pytest.raises(TypeError):
        orkpy.load_safetensors(3)
    with pytest.raises(orkpy.SafetensorsError, match=r"/dev/null: not a regular file"):
        orkpy.load_safetensors("/dev/null")


# ----------------------------------------------------------- broken files --

T = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
D8 = np.array([1.5, -2.0], np.float32).tobytes()


def hdr(header):
    return json.dumps(header).encode()


def entry(**kw):
    e = dict(T)
    e.update(kw)
    return e


# (id, file bytes, message regex after "<file>: ", official library also rejects?)
BROKEN = [
    ("empty_file", b"", r"file is 0 bytes, too short", True),
    ("seven_bytes", b"\x02\0\0\0\0\0\0", r"file is 7 bytes, too short", True),
    ("header_len_zero", struct.pack("<Q", 0) + D8, r"header length is zero", True),
    ("header_len_past_eof", struct.pack("<Q", 100) + b"{}", r"header length 100 is larger than the 2 bytes after it", True),
    ("header_len_over_100MB", struct.pack("<Q", 100_000_001) + b"{}", r"header length 100000001 is larger than the 100000000-byte limit", True),
    ("header_len_2_64", b"\xff" * 8 + b"{}", r"header length 18446744073709551615 is larger than", True),
    ("header_not_utf8", struct.pack("<Q", 8) + b'{"\xff":1} ', r"header is not valid UTF-8", True),
    ("header_not_json", struct.pack("<Q", 4) + b"{bad", r"header is not valid JSON", True),
    ("header_nul_padding", struct.pack("<Q", 4) + b"{}\0\0", r"header is not valid JSON", True),
    ("header_nan", struct.pack("<Q", 26) + b'{"__metadata__":{"a":NaN}}', r"header is not valid JSON \(NaN is not a JSON value\)", True),
    ("header_huge_integer", None, r"header is not valid JSON \(integer literal of 5000 characters, more than 100\)", True),
    ("header_nested_too_deeply", None, r"header is not valid JSON \(nested too deeply\)", True),
    ("header_is_list", struct.pack("<Q", 6) + b"[1, 2]", r"header is not a JSON object \(got list\)", True),
    ("duplicate_tensor", None, r"header has duplicate key 'a'", False),
    ("duplicate_field", None, r"header has duplicate key 'dtype'", True),
    ("entry_not_object", {"a": [1, 2]}, r"tensor 'a': header entry is a list, not an object", True),
    ("missing_dtype", {"a": {"shape": [2], "data_offsets": [0, 8]}}, r"tensor 'a': header entry is missing dtype", True),
    ("missing_shape", {"a": {"dtype": "F32", "data_offsets": [0, 8]}}, r"tensor 'a': header entry is missing shape", True),
    ("missing_offsets", {"a": {"dtype": "F32", "shape": [2]}}, r"tensor 'a': header entry is missing data_offsets", True),
    ("unexpected_field", {"a": entry(offsets=[0, 8])}, r"tensor 'a': header entry has unexpected field\(s\) 'offsets'", False),
    ("dtype_not_string", {"a": entry(dtype=4)}, r"tensor 'a': dtype must be a string, got 4", True),
    ("unknown_dtype", {"a": entry(dtype="F33")}, r"tensor 'a': unknown dtype 'F33'", True),
    ("lowercase_dtype", {"a": entry(dtype="f32")}, r"tensor 'a': unknown dtype 'f32'", True),
    ("fp8_unsupported", {"a": entry(dtype="F8_E4M3", shape=[8])}, r"tensor 'a': dtype F8_E4M3 is not supported", True),
    ("shape_not_list", {"a": entry(shape=2)}, r"tensor 'a': shape must be a list of integers, got 2", True),
    ("negative_dim", {"a": entry(shape=[-2])}, r"tensor 'a': shape \[-2\] has a negative dimension -2", True),
    ("float_dim", {"a": entry(shape=[2.0])}, r"tensor 'a': shape \[2.0\] has a non-integer dimension 2.0", True),
    ("bool_dim", {"a": entry(shape=[True, 2])}, r"tensor 'a': shape \[True, 2\] has a non-integer dimension True", True),
    ("string_dim", {"a": entry(shape=["2"])}, r"tensor 'a': shape \['2'\] has a non-integer dimension '2'", True),
    ("huge_dim", {"a": entry(shape=[2**64, 0])}, r"tensor 'a': shape .* has a dimension larger than 2\*\*64-1", True),
    ("too_many_dims", {"a": entry(shape=[1] * 33 + [2])}, r"tensor 'a': shape has 34 dimensions", False),
    ("offsets_three", {"a": entry(data_offsets=[0, 8, 8])}, r"tensor 'a': data_offsets must be \[begin, end\] integers, got \[0, 8, 8\]", True),
    ("offsets_dict", {"a": entry(data_offsets={"begin": 0})}, r"tensor 'a': data_offsets must be \[begin, end\] integers", True),
    ("offsets_float", {"a": entry(data_offsets=[0, 8.0])}, r"tensor 'a': data_offsets must be \[begin, end\] integers", True),
    ("offsets_negative", {"a": entry(data_offsets=[-8, 0], shape=[0])}, r"tensor 'a': data_offsets \[-8, 0\] out of range", True),
    ("offsets_reversed", {"a": entry(data_offsets=[8, 0], shape=[0])}, r"tensor 'a': data_offsets \[8, 0\] has begin > end", True),
    ("byte_length_mismatch", {"a": entry(shape=[3])}, r"tensor 'a': data_offsets \[0, 8\] span 8 bytes but F32 shape \[3\] needs 12", True),
    ("size_overflow", {"a": entry(shape=[2**62, 2**62])}, r"tensor 'a': data_offsets \[0, 8\] span 8 bytes but F32 shape .* needs 85070591730234615865843651857942052864", True),
    ("end_past_data", {"a": entry(shape=[4], data_offsets=[0, 16])}, r"tensor 'a': data_offsets \[0, 16\] run past the end of the 8-byte data section", True),
    ("overlap", {"a": T, "b": entry(shape=[1], data_offsets=[4, 8])}, r"tensor 'b': data_offsets \[4, 8\] overlap tensor 'a'", True),
    ("same_offsets", {"a": T, "b": T}, r"tensor 'b': data_offsets \[0, 8\] overlap tensor 'a'", True),
    ("empty_inside_other", {"a": T, "e": entry(shape=[0], data_offsets=[4, 4])}, r"tensor 'e': data_offsets \[4, 4\] overlap tensor 'a'", True),
    ("hole_at_start", {"a": entry(shape=[1], data_offsets=[4, 8])}, r"tensor 'a': data_offsets \[4, 8\] leave a hole of 4 unused bytes at the start", True),
    ("hole_between", {"a": entry(shape=[1], data_offsets=[0, 4]), "b": entry(shape=[0], data_offsets=[8, 8])},
     r"tensor 'b': data_offsets \[8, 8\] leave a hole of 4 unused bytes after tensor 'a'", True),
    ("trailing_bytes", ({"a": entry(shape=[1], data_offsets=[0, 4])}), r"4 trailing bytes after the last tensor", True),
    ("data_without_tensors", {"__metadata__": {"k": "v"}}, r"8 trailing bytes after the last tensor", True),
    ("metadata_not_object", {"__metadata__": ["x"]}, r"__metadata__ must be an object of strings, got list", True),
    ("metadata_not_string", {"__metadata__": {"k": 1}}, r"__metadata__\['k'\] must be a string, got 1", True),
    ("lone_surrogate_name", None, r"header key .* is not valid Unicode", True),
    ("bool_not_0_1", {"b": {"dtype": "BOOL", "shape": [8], "data_offsets": [0, 8]}}, r"tensor 'b': BOOL data holds a byte other than 0 or 1", False),
]


def broken_bytes(spec):
    if isinstance(spec, bytes):
        return spec
    if spec is None:
        return None
    h = hdr(spec)
    return struct.pack("<Q", len(h)) + h + D8


def broken_case(case_id, spec):
    if case_id == "header_huge_integer":
        h = b'{"a":{"dtype":"F32","shape":[' + b"1" * 5000 + b'],"data_offsets":[0,8]}}'
        return struct.pack("<Q", len(h)) + h + D8
    if case_id == "header_nested_too_deeply":
        h = b'{"__metadata__":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        return struct.pack("<Q", len(h)) + h
    if case_id == "duplicate_tensor":
        h = b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
        return struct.pack("<Q", len(h)) + h + D8
    if case_id == "duplicate_field":
        h = b'{"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
        return struct.pack("<Q", len(h)) + h + D8
    if case_id == "lone_surrogate_name":
        h = b'{"\\ud800":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
        return struct.pack("<Q", len(h)) + h + D8
    if case_id == "bool_not_0_1":
        h = hdr(spec)
        return struct.pack("<Q", len(h)) + h + bytes([0, 1, 0, 1, 2, 0, 1, 0])
    return broken_bytes(spec)


@pytest.mark.parametrize("case_id, spec, match, official", BROKEN, ids=[c[0] for c in BROKEN])
def test_broken_file_raises(tmp_path, case_id, spec, match, official):
    p = tmp_path / f"{case_id}.safetensors"
    p.write_bytes(broken_case(case_id, spec))
    with pytest.raises(orkpy.SafetensorsError, match=rf"^{p}: {match}"):
        orkpy.load_safetensors(p)
    assert issubclass(orkpy.SafetensorsError, ValueError)


def test_broken_cases_are_valid_once_fixed(tmp_path):
    """The builder and the T/D8 template really make a good file (so each broken
    case fails for its own reason only)."""
    p = tmp_path / "ok.safetensors"
    p.write_bytes(broken_bytes({"a": T}))
    assert orkpy.load_safetensors(p)["a"].tolist() == [1.5, -2.0]
    p.write_bytes(broken_bytes({"a": entry(shape=[1], data_offsets=[0, 4]), "b": entry(shape=[1], data_offsets=[4, 8])}))
    assert orkpy.load_safetensors(p)["b"].tolist() == [-2.0]
    p.write_bytes(broken_bytes({"a": T, "e": entry(shape=[0], data_offsets=[8, 8]),
                                "z": entry(shape=[0, 5], data_offsets=[0, 0])}))
    assert orkpy.load_safetensors(p)["e"].shape == (0,)
    p.write_bytes(struct.pack("<Q", 6) + b"  {}  ")  # JSON whitespace around the object is fine
    assert len(orkpy.load_safetensors(p)) == 0


# ------------------------------------------- the official library, if present --

def test_files_from_official_writer_load_identically(tmp_path, rng):
    st = pytest.importorskip("safetensors")
    stnp = pytest.importorskip("safetensors.numpy")
    arrs = {
        "z.f32": rng.standard_normal((5, 3)).astype(np.float32),
        "a.f16": rng.standard_normal((4,)).astype(np.float16),
        "f64": rng.standard_normal((2, 2, 2)),
        "i8": rng.integers(-128, 128, 7).astype(np.int8),
        "i32": rng.integers(-2**31, 2**31, 3).astype(np.int32),
        "i64": rng.integers(-2**40, 2**40, 3),
        "u8": rng.integers(0, 256, 9).astype(np.uint8),
        "bool": np.array([True, False, False]),
        "c64": np.array([1 + 2j, -3.5j], np.complex64),
        "scalar": np.array(2.5, np.float32),
        "empty": np.zeros((0, 3), np.float32),
    }
    p = tmp_path / "official.safetensors"
    stnp.save_file(arrs, str(p), metadata={"format": "np"})
    m = orkpy.load_safetensors(p)
    ref = stnp.load_file(str(p))
    assert set(m) == set(arrs) == set(ref)
    assert m.metadata == {"format": "np"}
    for k, a in arrs.items():
        assert m[k].dtype == a.dtype and m[k].shape == a.shape, k
        assert m[k].tobytes() == a.tobytes() == ref[k].tobytes(), k

    # BF16 through the official writer (it takes raw bytes plus a dtype name)
    bits = rng.integers(0, 2**16, size=(3, 4), dtype=np.uint16)
    q = tmp_path / "bf16.safetensors"
    buf = np.ascontiguousarray(bits, dtype="<u2")
    if hasattr(st, "TensorSpec"):  # safetensors >= 0.7 takes a pointer
        spec = st.TensorSpec(dtype="bfloat16", shape=[3, 4], data_ptr=buf.ctypes.data, data_len=buf.nbytes)
    else:
        spec = {"dtype": "bfloat16", "shape": [3, 4], "data": buf.tobytes()}
    st.serialize_file({"w": spec}, str(q))
    w = orkpy.load_safetensors(q)["w"]
    assert w.view(np.uint32).tolist() == bf16_bits_to_f32_reference(bits).view(np.uint32).tolist()


@pytest.mark.parametrize("case_id, spec, match, official", BROKEN, ids=[c[0] for c in BROKEN])
def test_official_library_agrees_on_broken_files(case_id, spec, match, official):
    """Every broken case the official reader also rejects is marked so; the few it
    accepts are where this reader is stricter on purpose (duplicate JSON keys,
    unknown entry fields, >32 dims, BOOL bytes other than 0/1)."""
    stnp = pytest.importorskip("safetensors.numpy")
    data = broken_case(case_id, spec)
    try:
        stnp.load(data)
        rejected = False
    except Exception:
        rejected = True
    assert rejected == official
