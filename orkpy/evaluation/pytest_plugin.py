"""orkpy's pytest plugin: accuracy gates as tests (registered by the ``pytest11`` entry point, so
installing orkpy is enough; ``-p no:orkpy`` turns it off).

Command-line options (also in ``addopts``)::

    --orkpy-model PATH       the quantized model under test (a GGUF or an orkpy model folder)
    --orkpy-reference PATH   its float reference (F32 / F16 / BF16 GGUF)
    --orkpy-text PATH        the scored text (not the calibration text)
    --orkpy-ctx N            tokens per chunk (default 512)
    --orkpy-chunks N         chunks scored (default 8; 0: the whole text)
    --orkpy-threads N        worker threads (default: all cores; never changes a figure)

Fixtures:

- ``orkpy_reference`` (session): the float reference's log-probs on the text, made once per test
  session (:class:`orkpy.evaluation.assertions.Reference`);
- ``orkpy_gate`` (session): ``orkpy_gate(model=None, max_kl=None, max_dppl=None,
  max_dppl_rel=None, min_same_top=None, reference=None, text=None)`` scores a model (a path or a
  loaded :class:`orkpy.Model`; default: ``--orkpy-model``) against the reference (default: the options'; other references and texts
  are made once each and kept for the session) and fails the test with a readable report (mean KL,
  delta PPL, same-top share, the worst chunks) when a threshold is exceeded; it returns the
  :class:`~orkpy.evaluation.assertions.GateResult`.

A five-line gate::

    # test_quantized.py -- pytest --orkpy-model q4/ --orkpy-reference f32.gguf --orkpy-text wiki.txt
    def test_q4_close_to_float(orkpy_gate):
        orkpy_gate(max_kl=0.05, max_dppl_rel=0.03)
"""
from __future__ import annotations

import os
from typing import Any, Dict, Optional, Tuple

import pytest

OPTIONS = ("model", "reference", "text")


def pytest_addoption(parser: Any) -> None:
    g = parser.getgroup("orkpy", "orkpy accuracy gates")
    g.addoption("--orkpy-model", default=None, metavar="PATH", help="the quantized model under test")
    g.addoption("--orkpy-reference", default=None, metavar="PATH", help="its float reference GGUF")
    g.addoption("--orkpy-text", default=None, metavar="PATH", help="the scored text")
    g.addoption("--orkpy-ctx", type=int, default=512, metavar="N", help="tokens per chunk (default 512)")
    g.addoption("--orkpy-chunks", type=int, default=8, metavar="N", help="chunks scored (default 8; 0: all)")
    g.addoption("--orkpy-threads", type=int, default=None, metavar="N", help="worker threads (default: all cores)")


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", "orkpy_gate: an accuracy gate (orkpy's pytest plugin)")


class Gate:
    """The ``orkpy_gate`` fixture's object (module doc)."""

    def __init__(self, config: Any, tmp: Any) -> None:
        self.config, self.tmp = config, tmp
        self._refs: Dict[Tuple[str, str, int, Optional[int]], Any] = {}

    def option(self, name: str, given: Any = None) -> Any:
        v = given if given is not None else self.config.getoption(f"--orkpy-{name}")
        if v is None and name in OPTIONS:
            pytest.fail(f"orkpy gate: no {name}: give --orkpy-{name} PATH (or pass {name}= to orkpy_gate)",
                        pytrace=False)
        if name in OPTIONS and isinstance(v, (str, os.PathLike)) and not os.path.exists(os.fspath(v)):
            pytest.fail(f"orkpy gate: the {name} {os.fspath(v)!r} does not exist", pytrace=False)
        return v

    def reference(self, reference: Any = None, text: Any = None) -> Any:
        """The float reference's log-probs (made once per reference, text, context and chunk count)."""
        from .assertions import make_reference
        ref = os.path.abspath(os.fspath(self.option("reference", reference)))
        txt = os.path.abspath(os.fspath(self.option("text", text)))
        n_ctx = int(self.config.getoption("--orkpy-ctx"))
        chunks = int(self.config.getoption("--orkpy-chunks")) or None
        key = (ref, txt, n_ctx, chunks)
        if key not in self._refs:
            out = self.tmp.mktemp("orkpy-reference") / "logprobs.npz"
            self._refs[key] = make_reference(ref, txt, out, n_ctx, chunks, self.config.getoption("--orkpy-threads"))
        return self._refs[key]

    def __call__(self, model: Any = None, max_kl: Optional[float] = None, max_dppl: Optional[float] = None,
                 max_dppl_rel: Optional[float] = None, min_same_top: Optional[float] = None,
                 reference: Any = None, text: Any = None) -> Any:
        from .assertions import AccuracyGateFailure, check_gate
        m = self.option("model", model)
        try:
            return check_gate(m, self.reference(reference, text), max_kl, max_dppl, max_dppl_rel, min_same_top,
                              threads=self.config.getoption("--orkpy-threads"))
        except AccuracyGateFailure as e:
            report = e.report
        pytest.fail(report, pytrace=False)  # outside the except: the report alone, no chained exception


@pytest.fixture(scope="session")
def orkpy_gate(pytestconfig: Any, tmp_path_factory: Any) -> Gate:
    """Scores a model against the float reference (module doc)."""
    return Gate(pytestconfig, tmp_path_factory)


@pytest.fixture(scope="session")
def orkpy_reference(orkpy_gate: Gate) -> Any:
    """The float reference's log-probs on the text, made once per session (module doc)."""
    return orkpy_gate.reference()
