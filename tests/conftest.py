import os
import pathlib

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = pathlib.Path(os.environ.get("ORKPY_SHARED", ROOT.parent / "shared"))


@pytest.fixture(scope="session")
def shared():
    """The ../shared data folder (skips with a reason when absent)."""
    if not SHARED.is_dir():
        pytest.skip(f"shared data folder not found at {SHARED} (set ORKPY_SHARED)")
    return SHARED


@pytest.fixture
def rng():
    return np.random.default_rng(12345)
