"""A decode Session shared between threads: the ids it records (``session.tokens``) are the ids its
KV cache holds, in the cache's order, whatever the interleaving of ``eval`` / ``rewind`` calls.

The session records the ids in its C state under the model's lock, in the same step that fills the
cache (csrc/ork/model.c ork_session_eval). A binding that appended to a Python list after the C call
returned (outside the lock) recorded two racing evals in either order, whichever thread got the GIL
back first, while the cache held them in the order the lock gave: the next ``eval([t])`` then differed
from ``forward(session.tokens + [t])`` (the logits of another sequence).

The check after each race: one more token's logits from the session equal the last row of the
batched forward over ``session.tokens + [t]`` bit for bit (the F32 path; tests/test_generate.py), and
``len(session.tokens) == session.pos``."""
import sys
import threading

import numpy as np
import pytest

import orkpy

ST = "models/stories260K/stories260K-F32.gguf"
TRIALS = 40


@pytest.fixture
def fast_switching():
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


@pytest.fixture(scope="module")
def stories(shared):
    return orkpy.load_model(shared / ST)


def _race(*calls):
    barrier = threading.Barrier(len(calls))
    errors = []

    def run(call):
        barrier.wait()
        try:
            call()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    ts = [threading.Thread(target=run, args=(c,)) for c in calls]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors


def _agrees(m, s, probe=3):
    """The session's cache holds the ids s.tokens says, in that order."""
    toks = s.tokens
    assert len(toks) == s.pos, (len(toks), s.pos)
    got = s.eval([probe], threads=1)
    want = m.forward(np.array(toks + [probe], np.int32), threads=1)[-1]
    s.rewind(len(toks))
    return np.array_equal(got, want), float(np.max(np.abs(got - want)))


def test_racing_evals_record_the_cache_order(stories, fast_switching):
    """4 threads each append 3 tokens one at a time (different ids per thread) to one session."""
    m = stories
    bad = []
    for trial in range(TRIALS):
        s = m.session(64)
        s.eval([1])

        def worker(first):
            def go():
                for j in range(3):
                    s.eval([first + j], threads=1)
            return go
        _race(*(worker(10 + 20 * i) for i in range(4)))
        assert s.pos == 13 and sorted(s.tokens) == sorted([1] + [10 + 20 * i + j for i in range(4) for j in range(3)])
        ok, diff = _agrees(m, s)
        if not ok:
            bad.append((trial, diff))
    assert not bad, f"{len(bad)} of {TRIALS} races recorded another order than the cache's: {bad[:5]}"


def test_rewind_racing_eval_records_the_cache(stories, fast_switching):
    """One thread evaluates tokens one at a time while another rewinds to a fixed position."""
    m = stories
    bad = []
    for trial in range(TRIALS):
        s = m.session(64)
        s.eval([1, 2, 3, 4])

        stop = threading.Event()

        def evals():
            for j in range(12):
                s.eval([30 + j], threads=1)
            stop.set()

        def rewinds():
            while not stop.is_set():
                s.rewind(min(s.pos, 3))   # pos may grow between the read and the call: never past it
        _race(evals, rewinds)
        toks = s.tokens
        assert toks[:3] == [1, 2, 3] and len(toks) == s.pos
        ok, diff = _agrees(m, s)
        if not ok:
            bad.append((trial, diff))
    assert not bad, f"{len(bad)} of {TRIALS} races recorded another sequence than the cache's: {bad[:5]}"


def test_tokens_is_a_consistent_snapshot_while_evals_run(stories):
    """Reading tokens / pos while another thread evaluates never sees a torn state: the list read
    is a prefix of the final one."""
    m = stories
    s = m.session(64)
    seen = []
    done = threading.Event()

    def evals():
        for j in range(40):
            s.eval([5 + j], threads=1)
        done.set()

    t = threading.Thread(target=evals)
    t.start()
    while not done.is_set():
        seen.append(s.tokens)
    t.join()
    final = s.tokens
    assert final == [5 + j for j in range(40)]
    assert all(final[:len(x)] == x for x in seen)
