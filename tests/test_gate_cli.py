"""The README's main job: `orkpy gate` end to end (synthetic model with no
arguments; the real stories260K files), and the imatrix / quantize CLI."""
import os

import pytest

from orkpy.cli import main


def _table_rows(out):
    return [l for l in out.splitlines() if l.startswith(("source (float)", "ours"))]


def test_gate_synthetic(capsys, tmp_path):
    assert main(["gate", "--chunks", "4", "--calib-chunks", "4", "--no-progress", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "its PPL means nothing" in out
    rows = _table_rows(out)
    assert len(rows) == 3 and "%" in rows[1]
    assert os.path.isfile(tmp_path / "model-imatrix" / "manifest.json")


def test_gate_synthetic_table_shows_what_orkpy_claims(capsys, tmp_path):
    """The README's first table (`orkpy gate` with no arguments, its defaults): the imatrix row has a lower
    mean KL than the row without it (a demo must not teach the opposite of the product's claim)."""
    assert main(["gate", "--no-progress"]) == 0
    cols = {r[:36].strip(): r[36:].split() for r in _table_rows(capsys.readouterr().out)}
    ours, plain = cols["ours: alloc + imatrix + nf4"], cols["ours without imatrix (nf4)"]
    assert float(ours[3]) < float(plain[3]), (ours, plain)


@pytest.mark.gate
def test_gate_on_real_files(shared, capsys, tmp_path):
    st = shared / "models" / "stories260K"
    rc = main(["gate", str(st / "stories260K-F16.gguf"), str(st / "stories260K-Q4_0.gguf"),
               str(shared / "text" / "tinystories-val-B.txt"), "--chunks", "50", "--calib-chunks", "100",
               "--no-progress", "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    print(out)
    cols = {r[:36].strip(): r[36:].split() for r in _table_rows(out)}
    src = float(cols["source (float)"][0])
    ours = cols["ours: alloc + imatrix + nf4"]
    plain = cols["ours without imatrix (nf4)"]
    assert float(ours[0]) < float(plain[0]) * 1.01          # imatrix does not hurt
    assert float(ours[0]) < src * 1.25 and 0 < float(ours[3]) < 0.5  # PPL and mean KLD in range
    assert ours[-1] == "34.1%"                              # the Q4_0 allocation's int8 share


def test_gate_usage_errors(capsys):
    assert main(["gate", "only-one-arg.gguf"]) == 2
    assert "usage" in capsys.readouterr().err


def test_imatrix_and_quantize_cli(shared, tmp_path, capsys):
    st = shared / "models" / "stories260K"
    im = tmp_path / "im.dat"
    assert main(["imatrix", str(st / "stories260K-F32.gguf"), str(shared / "text" / "tinystories-val-B.txt"),
                 "--ctx", "256", "--chunks", "10", "-o", str(im), "--no-progress"]) == 0
    assert im.exists()
    out = tmp_path / "q"
    assert main(["quantize", str(st / "stories260K-F16.gguf"), "--alloc", str(st / "stories260K-Q4_0.gguf"),
                 "--imatrix", str(im), "-o", str(out), "--no-progress"]) == 0
    assert "int8 share of weight storage" in capsys.readouterr().out
    assert main(["quantize", str(st / "stories260K-F16.gguf"), "--alloc", str(st / "stories260K-Q4_0.gguf"),
                 "-o", str(out), "--no-progress"]) == 1  # exists, no --overwrite: a runtime failure
    assert "use --overwrite" in capsys.readouterr().err
