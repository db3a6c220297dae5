"""Qt runs offscreen in these tests; fixtures for the built-in model, fake engines and whole app sessions."""

import os

os.environ["QT_QPA_PLATFORM"] = "offscreen"  # before anything imports Qt

import pytest  # noqa: E402

from app.builtin_model import BuiltinModel  # noqa: E402
from tests.model_store import model_path  # noqa: E402


@pytest.fixture(scope="session")
def builtin_model() -> str:
    """The real built-in model (Qwen2.5 Coder 0.5B Instruct), assembled from its part packages once."""
    return str(BuiltinModel().ensure())


@pytest.fixture(scope="session")
def small_model() -> str:
    """SmolLM2 135M: for tests of the app's machinery where only a fast real model matters, not which one."""
    return str(model_path("smollm2"))


@pytest.fixture
def make_session(qtbot, tmp_path, builtin_model):
    """Build AppSessions on a data dir (``tmp_path/data`` unless given) and close them all at the end.

    Sessions run the built-in model unless ``model`` (a GGUF path) is given; ``builtin`` replaces the
    built-in model (e.g. one that is not assembled yet).
    """
    from app.app_session import AppSession

    sessions = []

    def make(data=None, engine_factory=None, start=True, model=None, builtin=None):
        session = AppSession(data or tmp_path / "data", model=model, engine_factory=engine_factory, builtin=builtin)
        qtbot.addWidget(session.window)
        session.window.show()
        if start:
            session.start()
        sessions.append(session)
        return session

    (tmp_path / "data").mkdir()
    yield make
    for session in sessions:
        if not session.closed:
            session.close()
