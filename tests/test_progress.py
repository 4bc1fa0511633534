"""Progress reports (issue 12): a live tqdm bar on a terminal, sparse plain
lines when stderr is not a terminal (a log, CI), nothing when disabled, and a
plain-line fallback without tqdm."""
import io
import sys

import pytest

import orkpy
from orkpy import _io
from orkpy.cli import read_text_like_llama_cpp


class _Tty(io.StringIO):
    def isatty(self):
        return True


def _run(bar, n=100):
    for i in range(n):
        bar.set_postfix(ppl=f"{100.0 - i:.4f}")
        bar.update(1)
    bar.close()


@pytest.mark.parametrize("gap", [0.0, None])   # 0: every 10 % boundary prints; None: the default 2 s gap
def test_plain_lines_when_not_a_terminal(monkeypatch, gap):
    if gap is not None:
        monkeypatch.setattr(_io, "PLAIN_GAP", gap)
    buf = io.StringIO()
    bar = _io.progress_bar(100, "perplexity", True, "chunk", file=buf)
    assert isinstance(bar, _io.PlainProgress)
    _run(bar)
    out = buf.getvalue()
    lines = out.splitlines()
    assert 2 <= len(lines) <= 12 and "\r" not in out
    assert all(line.startswith("perplexity: ") for line in lines)
    assert lines[-1].startswith("perplexity: 100/100 chunks (100%)") and "ppl=1.0000" in lines[-1]
    if gap == 0.0:
        assert [line.split()[1] for line in lines] == ["1/100"] + [f"{k}/100" for k in range(10, 101, 10)]


def test_disabled_prints_nothing(capsys, shared):
    assert _io.progress_bar(100, "x", enabled=False) is None
    m = orkpy.load_model(shared / "models" / "stories260K" / "stories260K-F32.gguf")
    text = read_text_like_llama_cpp(shared / "text" / "tinystories-val-B.txt")
    orkpy.perplexity(m, text, n_ctx=128, chunks=3, progress=False)
    assert capsys.readouterr().err == ""


def test_perplexity_progress_in_a_log_is_sparse(capsys, shared):
    """stderr captured (not a terminal): a few plain lines, no per-chunk redraws."""
    m = orkpy.load_model(shared / "models" / "stories260K" / "stories260K-F32.gguf")
    text = read_text_like_llama_cpp(shared / "text" / "tinystories-val-B.txt")
    r = orkpy.perplexity(m, text, n_ctx=64, chunks=60, progress=True)
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.splitlines()
    assert 1 <= len(lines) <= 12
    assert lines[-1].startswith("perplexity: 60/60 chunks (100%)") and f"ppl={r.ppl:.4f}" in lines[-1]


def test_terminal_gets_tqdm_and_fallback_without_tqdm(monkeypatch):
    tqdm = pytest.importorskip("tqdm")   # a runtime dependency; the fallback is tested below either way
    bar = _io.progress_bar(10, "x", True, file=_Tty())
    assert isinstance(bar, tqdm.tqdm)
    bar.close()
    monkeypatch.setitem(sys.modules, "tqdm", None)        # import tqdm -> ImportError
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    buf = _Tty()
    bar = _io.progress_bar(10, "x", True, file=buf)
    assert isinstance(bar, _io.PlainProgress)
    _run(bar, 10)
    assert 1 <= len(buf.getvalue().splitlines()) <= 12


def test_notebook_uses_tqdm_auto(monkeypatch):
    auto = pytest.importorskip("tqdm.auto")
    monkeypatch.setattr(_io, "_in_notebook", lambda: True)
    bar = _io.progress_bar(10, "x", True, file=io.StringIO())   # a kernel's stream is not a tty
    assert isinstance(bar, auto.tqdm)
    bar.close()
