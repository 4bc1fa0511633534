"""Importance matrices: the real llama.cpp .dat of stories260K, .dat <-> GGUF round
trips (byte-identical re-saves), gguf-py cross-check, the Imatrix API, a stable
content hash and corrupt-file suites (every case a named FormatError, never a crash)."""
import json
import re
import struct

import numpy as np
import pytest

import orkpy
from orkpy.formats.gguf_write import write_gguf
from orkpy.quantization.imatrix import ImatrixError

DAT = "models/stories260K/stories260K-imatrix-B.dat"
F32 = "models/stories260K/stories260K-F32.gguf"
N_CTX = 256  # the shared .dat was computed with n_ctx 256 (shared/README.md)
# sha256() of the shared .dat loaded with chunk_size=256: pins the hash definition
DAT_SHA256_CS256 = "7b63652d8519120e9e3d0aa3e09982cc1d75926891bb8edb19a2239a4399bff7"


def parse_dat(data):
    """An independent minimal .dat parser: ({name: (ncall, stored float32 array)}, last_chunk, dataset, order)."""
    n = struct.unpack_from("<i", data, 0)[0]
    p, out, order = 4, {}, []
    for _ in range(n):
        ln = struct.unpack_from("<i", data, p)[0]
        name = data[p + 4:p + 4 + ln].decode()
        p += 4 + ln
        ncall, nval = struct.unpack_from("<ii", data, p)
        p += 8
        out[name] = (ncall, np.frombuffer(data, "<f4", nval, p).copy())
        order.append(name)
        p += 4 * nval
    last, ln = struct.unpack_from("<ii", data, p)
    dataset = data[p + 8:p + 8 + ln].decode()
    assert p + 8 + ln == len(data)
    return out, last, dataset, order


@pytest.fixture(scope="module")
def dat_path(shared):
    return shared / DAT


@pytest.fixture(scope="module")
def real(dat_path):
    return orkpy.Imatrix.load(dat_path, chunk_size=N_CTX)


# ------------------------------------------------------------- the real .dat --

def test_real_dat_matches_the_model(real, shared):
    assert real.format == "dat" and len(real) == 35
    assert real.chunks == 777 and real.chunk_size == N_CTX
    assert real.datasets == ["tinystories_val_B_calib.txt"]
    with orkpy.GGUFFile(shared / F32) as g:
        n_layers = g.metadata["llama.block_count"]
        for name in real.names():
            assert re.fullmatch(r"blk\.\d+\.(attn_[qkv]|attn_output|ffn_gate|ffn_up|ffn_down)\.weight", name), name
            assert name in g and g.tensor_info(name).ndim == 2
            k = g.tensor_info(name).shape[1]              # NumPy (N, K): K = ne0, the input channels
            v = real.values(name)
            assert v.dtype == np.float32 and v.shape == (k,)
            assert np.isfinite(v).all() and (v > 0).all()
            assert real.entry(name).count == 777 * N_CTX
        # every 2-D weight of every block is present (the default llama-imatrix skips output.weight)
        expected = {t.name for t in g.tensors if t.name.startswith("blk.") and t.ndim == 2}
        assert set(real.names()) == expected and len(expected) == 7 * n_layers
    # q, k and v read the same normed input, gate and up too: identical statistics
    for i in range(5):
        q = real[f"blk.{i}.attn_q.weight"]
        assert np.array_equal(q, real[f"blk.{i}.attn_k.weight"]) and np.array_equal(q, real[f"blk.{i}.attn_v.weight"])
        assert np.array_equal(real[f"blk.{i}.ffn_gate.weight"], real[f"blk.{i}.ffn_up.weight"])


def test_real_dat_agrees_with_the_quantized_models_record(real, shared):
    with orkpy.GGUFFile(shared / "models/stories260K/stories260K-Q4_K_M-imat.gguf") as g:
        m = g.metadata
        assert m["quantize.imatrix.entries_count"] == len(real)
        assert m["quantize.imatrix.chunks_count"] == real.chunks
        assert m["quantize.imatrix.dataset"] == real.datasets[-1]


def test_values_are_stored_over_ncall_whatever_the_chunk_size(dat_path):
    raw, last, dataset, _ = parse_dat(dat_path.read_bytes())
    for cs in (1, 256, 512, 1000):
        im = orkpy.Imatrix.load(dat_path, chunk_size=cs)
        assert im.chunk_size == cs
        for name, (ncall, stored) in raw.items():
            # llama-quantize: w[j] = stored[j] / ncall in float32 -- bit for bit
            assert np.array_equal(im.values(name), stored / np.float32(ncall)), (cs, name)
            assert im.entry(name).count == ncall * cs
            assert np.array_equal(im.entry(name).sums, stored.astype(np.float64) * cs)
    assert orkpy.Imatrix.load(dat_path).chunk_size == 512  # llama.cpp's default n_ctx


# --------------------------------------------------------------- round trips --

def test_dat_gguf_dat_round_trip_is_byte_identical(real, dat_path, tmp_path):
    real.save(tmp_path / "a.dat", format="dat")
    a = (tmp_path / "a.dat").read_bytes()
    # same content as llama.cpp's file (which is in unordered_map order); ours is sorted
    orig, last0, ds0, _ = parse_dat(dat_path.read_bytes())
    ours, last1, ds1, order = parse_dat(a)
    assert order == sorted(order) and (last1, ds1) == (last0, ds0) and ours.keys() == orig.keys()
    for n in orig:
        assert ours[n][0] == orig[n][0] and ours[n][1].tobytes() == orig[n][1].tobytes(), n
    # .dat -> GGUF -> .dat
    real.save(tmp_path / "b.gguf")
    g = orkpy.Imatrix.load(tmp_path / "b.gguf")
    assert g.format == "gguf" and g == real
    g.save(tmp_path / "c.dat", format="dat")
    assert (tmp_path / "c.dat").read_bytes() == a
    # .dat -> .dat -> .dat
    orkpy.Imatrix.load(tmp_path / "a.dat", chunk_size=N_CTX).save(tmp_path / "d.dat", format="dat")
    assert (tmp_path / "d.dat").read_bytes() == a
    # GGUF -> GGUF
    g.save(tmp_path / "e.gguf")
    assert (tmp_path / "e.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
    # values identical across formats (exact: every step is exact for these files)
    for n in real.names():
        assert np.array_equal(g[n], real[n])
        assert np.array_equal(orkpy.Imatrix.load(tmp_path / "c.dat")[n], real[n])
    assert g.sha256() == real.sha256() == DAT_SHA256_CS256


def test_gguf_imatrix_layout_and_gguf_py_reads_it(real, tmp_path):
    gguf = pytest.importorskip("gguf")
    p = tmp_path / "im.gguf"
    real.save(p)
    with orkpy.GGUFFile(p) as g:
        assert list(g.metadata_types.items()) == [("general.type", "STRING"), ("imatrix.datasets", "ARRAY"),
                                                  ("imatrix.chunk_count", "UINT32"), ("imatrix.chunk_size", "UINT32")]
        assert g.metadata["imatrix.datasets"] == real.datasets
        expected = [f"{n}{s}" for n in real.names() for s in (".in_sum2", ".counts")]
        assert [t.name for t in g.tensors] == expected
        for n in real.names():
            k = len(real.entry(n))
            # as llama.cpp writes dense entries: ggml drops the trailing ne of 1 -> 1-D tensors
            assert g.tensor_info(n + ".in_sum2").shape == (k,) and g.tensor_info(n + ".in_sum2").type == "F32"
            assert g.tensor_info(n + ".counts").shape == (1,) and g.tensor_info(n + ".counts").type == "F32"
    r = gguf.GGUFReader(p)
    assert r.fields["general.type"].contents() == "imatrix"
    assert r.fields["imatrix.datasets"].contents() == real.datasets
    assert r.fields["imatrix.chunk_count"].contents() == real.chunks
    assert r.fields["imatrix.chunk_size"].contents() == real.chunk_size
    assert [t.name for t in r.tensors] == expected
    for t in r.tensors:
        n, suffix = t.name.rsplit(".", 1)
        assert t.tensor_type == gguf.GGMLQuantizationType.F32
        if suffix == "in_sum2":
            assert list(t.shape) == [len(real.entry(n))]
            # llama-quantize: w = in_sum2 / count
            cnt = next(u for u in r.tensors if u.name == n + ".counts").data[0]
            assert np.array_equal((np.asarray(t.data) / cnt).astype(np.float32), real[n])
        else:
            assert list(t.shape) == [1] and t.data[0] == real.entry(n).count


def test_gguf_imatrix_two_dim_forms_and_in_sum_are_read(tmp_path):
    s = np.arange(1, 9, dtype=np.float32) * 3
    meta = [("general.type", "STRING", "imatrix"), ("imatrix.datasets", "ARRAY", ["a.txt", "b.txt"]),
            ("imatrix.chunk_count", "UINT32", 2), ("imatrix.chunk_size", "UINT32", 4)]
    write_gguf(tmp_path / "x.gguf", meta, [("w.weight.in_sum2", s.reshape(1, 8)),
                                           ("w.weight.counts", np.array([[8]], np.float32)),
                                           ("w.weight.in_sum", np.zeros(8, np.float32))])
    im = orkpy.Imatrix.load(tmp_path / "x.gguf")
    assert im.names() == ["w.weight"] and im.entry("w.weight").count == 8
    assert (im.chunks, im.chunk_size, im.datasets) == (2, 4, ["a.txt", "b.txt"])
    assert np.array_equal(im["w.weight"], s / 8)
    assert orkpy.Imatrix.load(tmp_path / "x.gguf", chunk_size=4).chunk_size == 4
    with pytest.raises(ValueError, match="records 4"):
        orkpy.Imatrix.load(tmp_path / "x.gguf", chunk_size=512)


# ------------------------------------------------------------------- the API --

def test_add_merge_values_and_counts():
    im = orkpy.Imatrix(chunk_size=4)
    assert len(im) == 0 and "a.weight" not in im
    im.add("b.weight", [4.0, 8.0], 4)
    im.add("a.weight", np.array([1.0, 2.0, 3.0]), 2)
    im.add("a.weight", np.array([1.0, 0.0, 1.0], np.float32), 2)
    assert im.names() == ["a.weight", "b.weight"] and list(im) == im.names()
    e = im.entry("a.weight")
    assert e.count == 4 and e.sums.dtype == np.float64 and e.sums.tolist() == [2.0, 2.0, 4.0]
    assert not e.sums.flags.writeable
    v = im["a.weight"]
    assert v.dtype == np.float32 and v.tolist() == [0.5, 0.5, 1.0] and np.array_equal(v, im.values("a.weight"))
    im.add("z.weight", np.zeros(3), 0)                  # no data yet: ones, as llama-quantize
    assert im["z.weight"].tolist() == [1.0, 1.0, 1.0]
    other = orkpy.Imatrix(chunk_size=4, chunks=3, datasets=["x.txt"])
    other.add("a.weight", [2.0, 2.0, 0.0], 4)
    other.add("c.weight", [1.0], 1)
    im.chunks = 5
    assert im.merge(other) is im
    assert im.entry("a.weight").count == 8 and im.entry("a.weight").sums.tolist() == [4.0, 4.0, 4.0]
    assert "c.weight" in im and im.chunks == 8 and im.datasets == ["x.txt"]
    with pytest.raises(KeyError, match="nope"):
        im["nope"]
    d = im.to_dict()
    json.dumps(d)
    assert d["n_entries"] == 4 and d["entries"]["a.weight"] == {"k": 3, "count": 8, "min": 0.5, "mean": 0.5,
                                                                 "max": 0.5}
    assert "sums" not in d["entries"]["a.weight"]
    assert im.to_dict(include_sums=True)["entries"]["c.weight"]["sums"] == [1.0]
    assert repr(im).startswith("Imatrix(entries=4, chunks=8, chunk_size=4")


def test_merge_is_all_or_nothing_and_checks_chunk_size():
    a = orkpy.Imatrix(chunk_size=4)
    a.add("x", [1.0, 2.0], 2)
    b = orkpy.Imatrix(chunk_size=4)
    b.add("a_first", [1.0], 1)
    b.add("x", [1.0, 2.0, 3.0], 3)
    with pytest.raises(ValueError, match="length 3 vs 2"):
        a.merge(b)
    assert a.names() == ["x"] and a.entry("x").count == 2
    with pytest.raises(ValueError, match="chunk sizes differ"):
        a.merge(orkpy.Imatrix(chunk_size=8))
    with pytest.raises(TypeError):
        a.merge({"x": 1})


@pytest.mark.parametrize("name, sums, count, exc, match", [
    ("w", [1.0, np.nan], 1, ValueError, r"sums\[1\] is nan"),
    ("w", [1.0, np.inf], 1, ValueError, "must be finite"),
    ("w", [1.0, -1.0], 1, ValueError, ">= 0"),
    ("w", [], 1, ValueError, "non-empty 1-D"),
    ("w", [[1.0]], 1, ValueError, "non-empty 1-D"),
    ("w", ["a"], 1, TypeError, "real numbers"),
    ("w", [1.0], -1, ValueError, "negative"),
    ("w", [1.0], 1.0, TypeError, "count must be an int"),
    ("w", [1.0], True, TypeError, "count must be an int"),
    ("w", [1.0], 0, ValueError, "count is 0 but"),
    ("", [1.0], 1, ValueError, "empty"),
    ("a\0b", [1.0], 1, ValueError, "NUL"),
    (3, [1.0], 1, TypeError, "name must be str"),
])
def test_add_rejects_bad_input(name, sums, count, exc, match):
    im = orkpy.Imatrix()
    with pytest.raises(exc, match=match):
        im.add(name, sums, count)
    assert len(im) == 0


def test_add_length_mismatch():
    im = orkpy.Imatrix()
    im.add("w", [1.0, 2.0], 1)
    with pytest.raises(ValueError, match="length 3, the entry has 2"):
        im.add("w", [1.0, 2.0, 3.0], 1)


def test_save_rules(tmp_path):
    im = orkpy.Imatrix(chunk_size=4, chunks=1, datasets=[])
    with pytest.raises(ValueError, match="no entries"):
        im.save(tmp_path / "e.gguf")
    im.add("a.weight", [1.0, 2.0], 6)
    im.add("b.weight", [0.0, 0.0, 0.0], 0)
    with pytest.raises(ValueError, match="format must be"):
        im.save(tmp_path / "x", format="json")
    # GGUF keeps the no-data entry (as llama.cpp does); .dat skips it
    im.save(tmp_path / "i.gguf")
    g = orkpy.Imatrix.load(tmp_path / "i.gguf")
    assert g == im and g.datasets == [] and g["b.weight"].tolist() == [1.0, 1.0, 1.0]
    im.save(tmp_path / "i.dat", format="dat")
    raw, last, dataset, order = parse_dat((tmp_path / "i.dat").read_bytes())
    assert order == ["a.weight"] and (last, dataset) == (1, "")
    ncall, stored = raw["a.weight"]
    assert ncall == 2  # ceil(6 / 4)
    assert np.array_equal(stored, np.array([1.0 / 6 * 2, 2.0 / 6 * 2], np.float32))
    d = orkpy.Imatrix.load(tmp_path / "i.dat", chunk_size=4)
    assert d.entry("a.weight").count == 8 and np.array_equal(d["a.weight"], g["a.weight"])
    only_empty = orkpy.Imatrix()
    only_empty.add("z", [0.0], 0)
    with pytest.raises(ValueError, match="count > 0"):
        only_empty.save(tmp_path / "z.dat", format="dat")
    long = orkpy.Imatrix()
    long.add("x" * 56, [1.0], 1)
    with pytest.raises(ValueError, match="longer than 55 bytes"):
        long.save(tmp_path / "l.gguf")
    huge = orkpy.Imatrix(chunks=2**31)
    huge.add("x", [1.0], 1)
    with pytest.raises(ValueError, match="int32"):
        huge.save(tmp_path / "h.dat", format="dat")


def test_sha256_stable_and_content_sensitive(real, dat_path):
    assert real.sha256() == DAT_SHA256_CS256
    assert orkpy.Imatrix.load(dat_path, chunk_size=N_CTX).sha256() == DAT_SHA256_CS256
    assert orkpy.Imatrix.load(dat_path, chunk_size=512).sha256() != DAT_SHA256_CS256  # sums and counts scale

    def make(order=("a", "b"), sums_a=(1.0, 2.0), count_a=3, name_b="b"):
        im = orkpy.Imatrix()
        for n in order:
            if n == "a":
                im.add("a", list(sums_a), count_a)
            else:
                im.add(name_b, [5.0], 7)
        return im

    base = make().sha256()
    assert re.fullmatch(r"[0-9a-f]{64}", base)
    assert make(order=("b", "a")).sha256() == base                     # insertion order does not matter
    m = make()
    m.chunks, m.datasets = 99, ["other.txt"]
    assert m.sha256() == base                                          # metadata is not hashed
    assert make(sums_a=(1.0, np.nextafter(2.0, 3.0))).sha256() != base  # one ulp
    assert make(count_a=4).sha256() != base
    assert make(name_b="c").sha256() != base
    assert make(sums_a=(1.0, 2.0, 0.0)).sha256() != base


# --------------------------------------------------------- corrupt .dat files --

def dat(entries=(("w.weight", 2, 2, [1.0, 2.0]),), last_chunk=3, dataset=b"d.txt", n=None, name_len=None):
    """A .dat from raw fields: entries = (name bytes/str, ncall, nval, values)."""
    out = struct.pack("<i", len(entries) if n is None else n)
    for name, ncall, nval, vals in entries:
        nb = name.encode() if isinstance(name, str) else name
        out += struct.pack("<i", len(nb) if name_len is None else name_len) + nb
        out += struct.pack("<ii", ncall, nval) + np.asarray(vals, "<f4").tobytes()
    return out + struct.pack("<ii", last_chunk, len(dataset)) + dataset


GOOD = dat()
E0 = 4 + 4 + 8          # offset of entry 0's ncall
V0 = E0 + 8             # offset of entry 0's values
TAIL = V0 + 8           # offset of last_chunk

DAT_CASES = [
    ("empty", b"", "entry count needs 4 bytes, only 0 left", 0),
    ("three bytes", b"\1\0\0", "needs 4 bytes, only 3 left", 0),
    ("zero entries", dat(entries=()), "entry count 0", 0),
    ("negative entry count", dat(n=-1), "entry count -1", 0),
    ("huge entry count", dat(n=2**31 - 1), "cannot fit", 0),
    ("entry count too big", dat(n=2), "entry 1 name", 36),
    ("name length 0", dat(name_len=0), "name length 0 is outside", 4),
    ("negative name length", dat(name_len=-5), "name length -5", 4),
    ("name length 64", dat(entries=(("x" * 64, 1, 1, [1.0]),)), "name length 64", 4),
    ("name past the end", dat(name_len=60)[:30], "truncated file: entry 0 name needs 60", 8),
    ("name not UTF-8", dat(entries=((b"w\xff", 1, 1, [1.0]),)), "not valid UTF-8", 8),
    ("name with NUL", dat(entries=((b"w\0x", 1, 1, [1.0]),)), "NUL", 8),
    ("duplicate name", dat(entries=(("w", 1, 1, [1.0]), ("w", 1, 1, [1.0]))), "duplicate entry 'w'", 4 + 17),
    ("ncall 0", dat(entries=(("w.weight", 0, 2, [1.0, 2.0]),)), "ncall 0 must be >= 1", E0),
    ("negative ncall", dat(entries=(("w.weight", -3, 2, [1.0, 2.0]),)), "ncall -3", E0),
    ("nval 0", dat(entries=(("w.weight", 1, 0, []),)), "nval 0 must be >= 1", E0 + 4),
    ("negative nval", dat(entries=(("w.weight", 1, -2, []),)), "nval -2", E0 + 4),
    ("huge nval", dat(entries=(("w.weight", 1, 2**31 - 1, [1.0]),)), "only", E0 + 4),
    ("nval larger than the values", dat(entries=(("w.weight", 1, 6, [1.0, 2.0]),)), "nval 6 needs 24 bytes", E0 + 4),
    ("NaN value", dat(entries=(("w.weight", 1, 2, [1.0, np.nan]),)), "value 1 is nan", V0 + 4),
    ("Inf value", dat(entries=(("w.weight", 1, 2, [np.inf, 1.0]),)), "value 0 is inf", V0),
    ("negative value", dat(entries=(("w.weight", 1, 2, [1.0, -2.0]),)), "negative", V0 + 4),
    ("no chunk count", GOOD[:TAIL], "last_chunk", TAIL),
    ("half a chunk count", GOOD[:TAIL + 2], "needs 4 bytes, only 2 left", TAIL),
    ("negative chunk count", dat(last_chunk=-1), "chunk count -1", TAIL),
    ("no dataset length", GOOD[:TAIL + 4], "dataset name length needs 4", TAIL + 4),
    ("negative dataset length", GOOD[:TAIL + 4] + struct.pack("<i", -1), "dataset name length -1", TAIL + 4),
    ("dataset past the end", GOOD[:-1], "dataset name length 5 is outside 0..4", TAIL + 4),
    ("trailing garbage", GOOD + b"\0", "1 bytes of trailing garbage", len(GOOD)),
]


@pytest.mark.parametrize("data, match, offset", [c[1:] for c in DAT_CASES], ids=[c[0] for c in DAT_CASES])
def test_corrupt_dat(tmp_path, data, match, offset):
    p = tmp_path / "bad.dat"
    p.write_bytes(data)
    with pytest.raises(ImatrixError, match=re.escape(match)) as ei:
        orkpy.Imatrix.load(p)
    assert isinstance(ei.value, orkpy.FormatError) and isinstance(ei.value, ValueError)
    assert str(p) in str(ei.value)
    if offset is not None:
        assert f"(at byte offset {offset})" in str(ei.value)


def test_good_synthetic_dat_loads(tmp_path):
    (tmp_path / "ok.dat").write_bytes(GOOD)
    im = orkpy.Imatrix.load(tmp_path / "ok.dat", chunk_size=4)
    assert im.names() == ["w.weight"] and im["w.weight"].tolist() == [0.5, 1.0]
    assert (im.chunks, im.datasets, im.entry("w.weight").count) == (3, ["d.txt"], 8)
    im.save(tmp_path / "again.dat", format="dat")
    assert (tmp_path / "again.dat").read_bytes() == GOOD


def test_every_truncation_of_the_real_dat_fails_cleanly(dat_path, tmp_path):
    data = dat_path.read_bytes()
    p = tmp_path / "t.dat"
    cuts = sorted(set(range(0, 200)) | set(range(len(data) - 200, len(data))) | set(range(0, len(data), 13)))
    for cut in cuts:
        p.write_bytes(data[:cut])
        with pytest.raises(orkpy.FormatError):
            orkpy.Imatrix.load(p)


def test_random_corruption_never_crashes(dat_path, tmp_path):
    data = dat_path.read_bytes()
    rng = np.random.default_rng(7)
    p = tmp_path / "f.dat"
    loaded = failed = 0
    for _ in range(400):
        b = bytearray(data)
        for _ in range(int(rng.integers(1, 4))):
            b[int(rng.integers(0, len(b)))] = int(rng.integers(0, 256))
        p.write_bytes(bytes(b))
        try:
            im = orkpy.Imatrix.load(p)
        except orkpy.FormatError:
            failed += 1
            continue
        loaded += 1
        for n in im.names():
            v = im[n]
            assert np.isfinite(v).all() and (v >= 0).all()
    assert failed > 0 and loaded > 0


# -------------------------------------------------- corrupt GGUF imatrix files --

META = [("general.type", "STRING", "imatrix"), ("imatrix.datasets", "ARRAY", ["d.txt"]),
        ("imatrix.chunk_count", "UINT32", 1), ("imatrix.chunk_size", "UINT32", 4)]
S = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
C = np.array([4.0], np.float32)
TENSORS = [("w.weight.in_sum2", S), ("w.weight.counts", C)]


def _meta(drop=None, **replace):
    out = []
    for k, t, v in META:
        if k == drop:
            continue
        out.append(replace.get(k.replace(".", "_"), (k, t, v)))
    return out


GGUF_CASES = [
    ("no general.type", _meta(drop="general.type"), TENSORS, "no general.type"),
    ("general.type model", _meta(general_type=("general.type", "STRING", "model")), TENSORS, "not 'imatrix'"),
    ("no chunk_count", _meta(drop="imatrix.chunk_count"), TENSORS, "missing metadata key imatrix.chunk_count"),
    ("no chunk_size", _meta(drop="imatrix.chunk_size"), TENSORS, "missing metadata key imatrix.chunk_size"),
    ("no datasets", _meta(drop="imatrix.datasets"), TENSORS, "missing metadata key imatrix.datasets"),
    ("chunk_size UINT64", _meta(imatrix_chunk_size=("imatrix.chunk_size", "UINT64", 4)), TENSORS, "must be UINT32"),
    ("chunk_size 0", _meta(imatrix_chunk_size=("imatrix.chunk_size", "UINT32", 0)), TENSORS, "chunk_size is 0"),
    ("datasets not strings", _meta(imatrix_datasets=("imatrix.datasets", "ARRAY", np.array([1], np.int32))),
     TENSORS, "array of strings"),
    ("no tensors", META, [], "no imatrix entries"),
    ("in_sum2 without counts", META, TENSORS[:1], "has in_sum2 but no counts"),
    ("counts without in_sum2", META, TENSORS[1:], "has counts but no in_sum2"),
    ("unknown tensor", META, TENSORS + [("w.weight", S)], "unexpected tensor 'w.weight'"),
    ("F16 in_sum2", META, [("w.weight.in_sum2", S.astype(np.float16)), TENSORS[1]], "is F16, expected F32"),
    ("NaN in_sum2", META, [("w.weight.in_sum2", np.array([1, np.nan], np.float32)), TENSORS[1]], "[1] is nan"),
    ("negative in_sum2", META, [("w.weight.in_sum2", np.array([-1.0], np.float32)), TENSORS[1]], "finite and >= 0"),
    ("3-D in_sum2", META, [("w.weight.in_sum2", S.reshape(1, 1, 4)), TENSORS[1]], "expected (K,) or (n_mat, K)"),
    ("counts shape (2,)", META, [TENSORS[0], ("w.weight.counts", np.array([4, 4], np.float32))], "has shape (2,)"),
    ("fractional count", META, [TENSORS[0], ("w.weight.counts", np.array([2.5], np.float32))], "is 2.5"),
    ("negative count", META, [TENSORS[0], ("w.weight.counts", np.array([-4], np.float32))], "is -4.0"),
    ("infinite count", META, [TENSORS[0], ("w.weight.counts", np.array([np.inf], np.float32))], "is inf"),
    ("zero count with sums", META, [TENSORS[0], ("w.weight.counts", np.zeros(1, np.float32))], "is 0 but"),
    ("in_sum size mismatch", META, TENSORS + [("w.weight.in_sum", S[:2])], "has 2 elements"),
]


@pytest.mark.parametrize("meta, tensors, match", [c[1:] for c in GGUF_CASES], ids=[c[0] for c in GGUF_CASES])
def test_corrupt_gguf_imatrix(tmp_path, meta, tensors, match):
    p = tmp_path / "bad.gguf"
    write_gguf(p, meta, tensors)
    with pytest.raises(ImatrixError, match=re.escape(match)) as ei:
        orkpy.Imatrix.load(p)
    assert isinstance(ei.value, orkpy.FormatError) and str(p) in str(ei.value)


def test_good_synthetic_gguf_imatrix_loads(tmp_path):
    write_gguf(tmp_path / "ok.gguf", META, TENSORS)
    im = orkpy.Imatrix.load(tmp_path / "ok.gguf")
    assert im["w.weight"].tolist() == [0.25, 0.5, 0.75, 1.0] and im.entry("w.weight").count == 4
    im.save(tmp_path / "again.gguf")
    assert (tmp_path / "again.gguf").read_bytes() == (tmp_path / "ok.gguf").read_bytes()


def test_moe_gguf_imatrix_is_not_implemented(tmp_path):
    write_gguf(tmp_path / "moe.gguf", META, [("e.weight.in_sum2", np.ones((2, 4), np.float32)),
                                             ("e.weight.counts", np.array([[3], [5]], np.float32))])
    with pytest.raises(NotImplementedError, match="2 matrices"):
        orkpy.Imatrix.load(tmp_path / "moe.gguf")


def test_model_gguf_and_broken_container(tmp_path, shared):
    with pytest.raises(ImatrixError, match="general.type"):
        orkpy.Imatrix.load(shared / F32)
    write_gguf(tmp_path / "ok.gguf", META, TENSORS)
    data = (tmp_path / "ok.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:40])
    with pytest.raises(orkpy.GGUFError):
        orkpy.Imatrix.load(tmp_path / "cut.gguf")
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        orkpy.Imatrix.load(tmp_path / "ok.gguf", chunk_size=0)
    with pytest.raises(FileNotFoundError):
        orkpy.Imatrix.load(tmp_path / "missing.dat")
