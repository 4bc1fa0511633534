"""load_model(dir) against a concurrent save(dir, overwrite=True): the loaded model is the old one
or the new one, complete -- never blobs of one under the manifest of the other -- or a FormatError
(docs/security.md, "Model directories"). The loader verifies the checksums on the very descriptors
and mappings it then loads from, all opened relative to one descriptor of the directory.

- forced interleavings: the directory is swapped for another model right after the checks
  (same file names, other bytes: a silent mix before the fix; other file names: FileNotFoundError
  before the fix), and inside the reader, between the manifest and the files it lists;
- a real race: a child process saves two models alternately over one directory (RENAME_EXCHANGE,
  and the move-aside fallback) while this process loads it again and again.
"""
import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import orkpy
import orkpy.evaluation.synthetic as syn
import orkpy.formats.modeldir as modeldir
import orkpy.runtime.model as runtime_model
from orkpy import FormatError, TierEntry, TierMap
from orkpy.quantization.calibrate import quantize_model

TOKENS = np.array([1, 5, 9, 17, 33, 65, 2, 7], np.int32)
SYN = dict(n_layer=1, n_embd=64, n_ff=96, n_head=2, n_head_kv=1)


def fingerprint(m):
    """SHA-256 over every linear's stored arrays and the logits of a fixed prompt (one thread):
    two loads of one directory give one fingerprint; a model mixing two directories' files
    gives neither's."""
    h = hashlib.sha256()
    for name, s in m.linears.items():
        h.update(name.encode())
        for a in (s.store, s.bscale, s.weight):
            if a is not None:
                h.update(np.ascontiguousarray(a).tobytes())
    h.update(m.forward(TOKENS, threads=1).tobytes())
    return h.hexdigest()


def _int8_map(alloc):
    """The synthetic allocation with every int4 linear int8: its blobs are .o8n1, not .o4n1."""
    tm = TierMap.load(alloc)
    entries = {n: TierEntry("int8" if e.tier == "int4" else e.tier, e.ggml_type, e.shape, e.intended)
               for n, e in tm.entries.items()}
    return TierMap(entries, tm.threshold, tm.source, tm.tied)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Three small models of one architecture: "a" and "b" (two seeds, one allocation: the same
    file names and kinds, other bytes) and "c" ("b"'s weights with int8 linears: other file names).
    Returns base folder, {name: QuantizedModel}, {name: fingerprint of the saved directory}."""
    base = tmp_path_factory.mktemp("race")
    for seed in (0, 1):
        syn.make_synthetic(str(base / f"s{seed}"), seed=seed, **SYN)
    alloc = str(base / "s0" / "synthetic-alloc.map")
    q = dict(kind="nf4", progress=False, log=lambda s: None)
    qms = {"a": quantize_model(str(base / "s0" / "synthetic-F16.gguf"), alloc, **q),
           "b": quantize_model(str(base / "s1" / "synthetic-F16.gguf"), alloc, **q),
           "c": quantize_model(str(base / "s1" / "synthetic-F16.gguf"), _int8_map(alloc), **q)}
    fps = {}
    for k, qm in qms.items():
        d = qm.save(str(base / f"ref-{k}"))
        fps[k] = fingerprint(orkpy.load_model(d))
        assert fps[k] == fingerprint(orkpy.load_model(d))  # deterministic
    assert len(set(fps.values())) == 3
    names = {k: sorted(os.listdir(base / f"ref-{k}")) for k in qms}
    assert names["a"] == names["b"] != names["c"]
    return base, qms, fps


# ------------------------------------------------------- forced interleavings --

@pytest.mark.parametrize("other", ["b", "c"])
def test_swap_right_after_the_checks_loads_the_old_model(models, tmp_path, monkeypatch, other):
    """The directory is replaced (save overwrite=True: exchanged, the old one deleted) right after
    the loader verified the checksums: the model loaded is the old one, bit for bit. Before the fix
    the loader opened the files again by path: "b" gave a silent mix, "c" a FileNotFoundError."""
    _, qms, fps = models
    d = str(tmp_path / "m")
    qms["a"].save(d)
    real = runtime_model.read_model_dir
    swapped = []

    def read_then_swap(path):
        got = real(path)
        qms[other].save(d, overwrite=True)
        swapped.append(True)
        return got
    monkeypatch.setattr(runtime_model, "read_model_dir", read_then_swap)
    m = orkpy.load_model(d)
    assert swapped
    assert fingerprint(m) == fps["a"]
    monkeypatch.undo()
    assert fingerprint(orkpy.load_model(d)) == fps[other]  # the new one, afterwards


def _hook_manifest(monkeypatch, after):
    """Run ``after(n)`` right after the loader's n-th manifest read (n = 1, 2, ...); the reads a save
    makes meanwhile (its overwrite check) are not counted. Returns the list of loader reads."""
    real, reads, busy = modeldir._read_manifest, [], []

    def hooked(dfd, path):
        got = real(dfd, path)
        if not busy:
            reads.append(path)
            busy.append(1)
            try:
                after(len(reads))
            finally:
                busy.clear()
        return got
    monkeypatch.setattr(modeldir, "_read_manifest", hooked)
    return reads


@pytest.mark.parametrize("other", ["b", "c"])
def test_swap_between_the_manifest_and_its_files_reads_the_old_directory(models, tmp_path, monkeypatch, other):
    """The directory is moved aside (complete) and another model saved in its place after the
    manifest was read, before the files it lists are opened: they are read from the directory the
    manifest came from, so the model is the old one."""
    _, qms, fps = models
    d = str(tmp_path / "m")
    qms["a"].save(d)

    def swap(n):
        if n == 1:
            os.rename(d, str(tmp_path / "aside"))
            qms[other].save(d)
    reads = _hook_manifest(monkeypatch, swap)
    assert fingerprint(orkpy.load_model(d)) == fps["a"]
    assert len(reads) == 1


@pytest.mark.parametrize("other", ["b", "c"])
def test_old_directory_deleted_under_the_reader_is_read_again(models, tmp_path, monkeypatch, other):
    """save(overwrite=True) after the manifest was read: the old directory is deleted, its files
    vanish under the reader, which reads the directory again: the new model, complete."""
    _, qms, fps = models
    d = str(tmp_path / "m")
    qms["a"].save(d)
    reads = _hook_manifest(monkeypatch, lambda n: qms[other].save(d, overwrite=True) if n == 1 else None)
    assert fingerprint(orkpy.load_model(d)) == fps[other]
    assert len(reads) == 2


def test_a_directory_replaced_on_every_attempt_is_a_format_error(models, tmp_path, monkeypatch):
    _, qms, _ = models
    d = str(tmp_path / "m")
    qms["a"].save(d)
    reads = _hook_manifest(monkeypatch, lambda n: qms["b" if n % 2 else "a"].save(d, overwrite=True))
    with pytest.raises(FormatError, match=rf"{d}: .* \(read {modeldir.READ_ATTEMPTS} times: the directory was "
                                          "replaced or removed while it was read"):
        orkpy.load_model(d)
    assert len(reads) == modeldir.READ_ATTEMPTS


def test_directory_missing_during_a_move_aside_save_is_a_format_error(models, tmp_path, monkeypatch):
    """Where the kernel cannot swap two folders, a save moves the old one aside before renaming the
    new one in: a load in that moment finds no directory -- a FormatError, not FileNotFoundError."""
    _, qms, _ = models
    d = tmp_path / "m"
    qms["a"].save(str(d))
    os.rename(d, tmp_path / ".m.tmp-1-2-0123abcd")      # the moment between the two renames
    with pytest.raises(FormatError, match=f"{d}: no such directory"):
        orkpy.load_model(d)
    with pytest.raises(FileNotFoundError):                # no save in progress: a missing path, as before
        orkpy.load_model(tmp_path / "n")


# ---------------------------------------------------------------- real race --

CHILD = textwrap.dedent("""
    import os, signal, sys
    import orkpy.formats.modeldir as md
    from orkpy.quantization.calibrate import quantize_model
    base, path, exchange = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    if not exchange:
        md._exchange_dirs = lambda a, b: False   # the fallback: move aside, then rename
    alloc = os.path.join(base, "s0", "synthetic-alloc.map")
    models = [quantize_model(os.path.join(base, f"s{s}", "synthetic-F16.gguf"), alloc, kind="nf4",
                             progress=False, log=lambda m: None) for s in (0, 1)]
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    print("ready", flush=True)
    i = 0
    while not stop:
        models[i % 2].save(path, overwrite=True)
        i += 1
    print("saves", i, flush=True)
""")


def _env():
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env


def race(base, path, fps, seconds, exchange=True):
    """Load ``path`` for ``seconds`` while a child saves models "a" and "b" over it in turn;
    returns (counts per outcome, the child's number of saves, examples of unexpected errors)."""
    counts = {"a": 0, "b": 0, "mix": 0, "FormatError": 0, "other": 0}
    others = []
    want = {fps["a"]: "a", fps["b"]: "b"}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(base), str(path), "1" if exchange else "0"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        assert child.stdout.readline().strip() == "ready", child.stderr.read()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                m = orkpy.load_model(path)
            except FormatError:
                counts["FormatError"] += 1
                continue
            except Exception as e:  # noqa: BLE001 - counted and reported
                counts["other"] += 1
                others.append(f"{type(e).__name__}: {e}")
                continue
            counts[want.get(fingerprint(m), "mix")] += 1
            del m
    finally:
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    saves = int(out.split()[-1])
    return counts, saves, others[:5]


@pytest.mark.slow
@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "move-aside"])
def test_loads_racing_saves_are_never_a_mix(models, tmp_path, exchange):
    base, qms, fps = models
    path = tmp_path / "m"
    qms["a"].save(str(path))
    counts, saves, others = race(base, path, fps, 8.0 if exchange else 5.0, exchange)
    print(f"\n{'exchange' if exchange else 'move-aside'}: {saves} saves; loads: {counts}")
    assert counts["mix"] == 0 and counts["other"] == 0, (counts, others)
    assert saves > 20 and counts["a"] + counts["b"] > 20, counts     # the race ran
    assert counts["a"] and counts["b"], counts
    # a load fails only where the directory was replaced on every attempt
    assert counts["FormatError"] <= (counts["a"] + counts["b"]) // 10, counts


def test_mapped_file_of_a_descriptor_keeps_the_file_it_was_given(tmp_path):
    """MappedFile(path, fd=): the open file is mapped (a duplicate of the descriptor: the caller closes
    its own), whatever is at ``path`` later; ``path`` only names it."""
    from orkpy._mapped import MappedFile
    p = tmp_path / "f"
    p.write_bytes(b"old bytes")
    fd = os.open(p, os.O_RDONLY)
    try:
        m = MappedFile(str(p), fd=fd)
    finally:
        os.close(fd)
    (tmp_path / "g").write_bytes(b"new bytes!")
    os.replace(tmp_path / "g", p)
    assert m[:] == b"old bytes" and len(m) == 9 and m.path == str(p)
    m.check()                                             # its file did not change: it was replaced
    m.close()
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(IsADirectoryError):
            MappedFile(str(tmp_path), fd=dfd)
    finally:
        os.close(dfd)
    with pytest.raises(ValueError, match="negative"):
        MappedFile(str(p), fd=-1)


def test_links_are_followed_only_to_files_of_the_directory(models, tmp_path):
    """Files are opened relative to the directory's descriptor: a symbolic link is followed when it
    names another file of the directory (a chain of them too), any other target is refused."""
    _, qms, fps = models
    d = tmp_path / "m"
    qms["a"].save(str(d))
    fn = "blk.0.attn_q.weight.o4n1"
    os.replace(d / fn, d / "data.bin")
    os.symlink("link2", d / fn)
    os.symlink("data.bin", d / "link2")
    assert fingerprint(orkpy.load_model(d)) == fps["a"]
    os.remove(d / fn)
    os.symlink(os.path.join("..", "m", "data.bin"), d / fn)  # inside after all, but not by a plain name
    with pytest.raises(FormatError, match=f"{fn} is a symbolic link to ../m/data.bin, outside the model directory"):
        orkpy.load_model(d)
