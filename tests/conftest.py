"""Every test, and every app process a test starts, shares one assembled copy of the built-in model; the parity
tests' peer library is checked once before any test imports it.

It lives in ``builtin/`` of the test model cache (``tests/model_store.builtin_dir``) unless ``HEARTH_BUILTIN_DIR``
is already set, so no test writes 490 MB into the user's own data folder or into a temporary one. And no test
may leave the app's log file handler on the root logger.
"""

import logging
import os

import pytest

from tests.llama_cpp_peer import ensure_safe
from tests.model_store import builtin_dir

os.environ.setdefault("HEARTH_BUILTIN_DIR", str(builtin_dir()))


def pytest_configure(config):
    """Before any test module imports ``llama_cpp``: rebuild it without AMX where pip built it with kernels that
    die with SIGILL on this machine (``tests/llama_cpp_peer.py``)."""
    ensure_safe()


@pytest.fixture(autouse=True)
def _no_app_log_file_left_behind():
    """A test that points the root logger at the app's log file (``app.logging_setup``) must take it off again:
    otherwise every later test logs into that test's temporary directory, which pytest may already have deleted."""
    yield
    left = [h for h in logging.getLogger().handlers if getattr(h, "hearth_log", False)]
    assert not left, f"the app's log handler was left on the root logger: {left}"
