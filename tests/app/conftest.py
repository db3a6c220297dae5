"""Qt runs offscreen in these tests; fixtures for the built-in model, fake engines and whole app sessions."""

import os

os.environ["QT_QPA_PLATFORM"] = "offscreen"  # before anything imports Qt

import pytest  # noqa: E402

from app.paths import builtin_model_path  # noqa: E402


@pytest.fixture(scope="session")
def builtin_model() -> str:
    return str(builtin_model_path())


@pytest.fixture
def make_session(qtbot, tmp_path):
    """Build AppSessions on a data dir (``tmp_path/data`` unless given) and close them all at the end."""
    from app.app_session import AppSession

    sessions = []

    def make(data=None, engine_factory=None, start=True):
        session = AppSession(data or tmp_path / "data", engine_factory=engine_factory)
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
