"""The base-model label never reads a GGUF on the GUI thread: it comes from the loaded model's info, the metadata
cache, or a read on a worker thread whose answer relabels the window when it arrives."""

import threading

import pytest

from app.model_choices import ModelChoices
from app.qt_compat import emit
from tests.app.models.tiny_gguf import write_tiny_gguf

from .fake_engine import FakeFactory, FakeModel

pytestmark = pytest.mark.gui


def test_a_file_not_yet_read_is_read_off_the_gui_thread_and_then_labelled(qtbot, make_session, tmp_path,
                                                                          monkeypatch):
    readers = []
    read = ModelChoices.is_base_model

    def recording(self, path):
        readers.append(threading.current_thread())
        return read(self, path)

    monkeypatch.setattr(ModelChoices, "is_base_model", recording)
    session = make_session(engine_factory=FakeFactory(FakeModel(["and then"])))  # its info has no chat_template
    window, c = session.window, session.controller
    path = str(write_tiny_gguf(tmp_path / "base.gguf", name="Base", chat_template=None))
    with qtbot.waitSignal(window.base_models.learned, timeout=20000,
                          check_params_cb=lambda learned: learned == path):
        c.set_model(path)
    assert readers and threading.main_thread() not in readers
    assert window.composer.model_label.text().endswith("· base model — text completion")
    assert "base model — text completion" in window.chat_view._empty.text()


def test_the_loaded_models_own_info_decides_without_any_read(qtbot, make_session, tmp_path, monkeypatch):
    monkeypatch.setattr(ModelChoices, "is_base_model", lambda self, path: pytest.fail("read the file"))
    session = make_session(engine_factory=FakeFactory(FakeModel(["and then"])))
    labels, c = session.window.base_models, session.controller
    for has_template, base in ((False, True), (True, False)):
        path = str(tmp_path / f"model-{has_template}.gguf")
        assert labels.is_base_model(path, {"path": path, "chat_template": has_template}) is base
    assert labels.is_base_model(c.builtin_path, {}) is False  # the built-in model is a chat model
    emit(labels.learned, "unrelated")  # a late answer for another file leaves the shown label alone
    assert "base model" not in session.window.composer.model_label.text()


def test_the_workers_loaded_info_says_whether_the_file_has_a_chat_template(tmp_path):
    import engine.model
    from app.worker import chat_template_info

    for template, expected in (("{{ messages }}", True), (None, False)):
        path = write_tiny_gguf(tmp_path / f"{expected}.gguf", chat_template=template)
        model = engine.model.load(str(path), backend="numpy")
        try:
            assert chat_template_info(model) == {"chat_template": expected}
        finally:
            model.close()
    assert chat_template_info(FakeModel()) == {}  # not read from a GGUF: the window asks the file instead
