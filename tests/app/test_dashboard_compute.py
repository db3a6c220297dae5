"""The dashboard names how the loaded model computes where the backend chooses per model (MLX's dtype and why)."""

from __future__ import annotations

import pytest

import engine.model
from engine.backends import platform_mlx
from engine.backends.mlx_compute import choose_for_file
from engine.config import ModelConfig
from engine.gguf_file import read_gguf

from .fake_engine import FakeFactory, FakeModel

pytestmark = pytest.mark.gui


@pytest.mark.mlx
@pytest.mark.slow
def test_an_mlx_model_on_a_mac_gpu_shows_its_compute_dtype_and_why(small_model, qtbot, make_session, monkeypatch):
    monkeypatch.setattr(platform_mlx, "default_device_is_gpu", lambda: True)  # load as a Mac GPU would
    session = make_session(model=small_model,
                           engine_factory=lambda path, n_ctx: engine.model.load(path, backend="mlx", n_ctx=n_ctx))
    qtbot.waitUntil(lambda: bool(session.controller.model_info), timeout=120000)
    label = session.window.dashboard.compute_label
    with read_gguf(small_model) as gguf:
        expected = choose_for_file(gguf, ModelConfig.from_gguf(gguf), on_gpu=True)
    assert session.controller.model_info["backend"] == "mlx"
    assert label.text() == f"MLX compute {expected.describe()}" and expected.name == "float16"
    session.window.show_page("dashboard")
    assert label.isVisible()


def test_a_backend_without_a_per_model_choice_shows_no_compute_label(qtbot, make_session):
    session = make_session(engine_factory=FakeFactory(FakeModel()))
    qtbot.waitUntil(lambda: bool(session.controller.model_info), timeout=20000)
    session.window.show_page("dashboard")
    label = session.window.dashboard.compute_label
    assert session.controller.model_info["compute"] is None and label.text() == "" and not label.isVisible()
