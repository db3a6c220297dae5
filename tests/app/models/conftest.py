"""Fixtures for the model-manager tests: a fake Hub on 127.0.0.1, tiny models, no real token or network."""

from __future__ import annotations

from pathlib import Path

import pytest
from huggingface_hub import constants

from app.models.downloads import DownloadManager
from app.models.hub import HubClient
from tests.app.models.fake_hub import FakeHub
from tests.app.models.tiny_gguf import write_tiny_gguf

REPO = "acme/Tiny-GGUF"
FILE = "tiny-q8_0.gguf"


@pytest.fixture(autouse=True)
def no_real_hub_credentials(monkeypatch, tmp_path):
    """Tests see only the tokens and endpoints they set themselves."""
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-saved-token"))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> bytes:
    """A valid 3.2 MB GGUF model (random float32 padding), big enough for many 64 KiB chunks."""
    path = write_tiny_gguf(tmp_path_factory.mktemp("tiny") / FILE, name="Tiny Download", extra_bytes=(3 << 20) - (128 << 10))
    return path.read_bytes()


@pytest.fixture
def hub(tiny_model, monkeypatch):
    with FakeHub() as fake:
        fake.add_file(REPO, FILE, tiny_model, downloads=10)
        fake.add_file(REPO, "README.md", b"# Tiny\n", lfs=False)
        monkeypatch.setenv("HF_ENDPOINT", fake.url)
        yield fake


@pytest.fixture
def make_manager(hub, tmp_path):
    """A DownloadManager on ``tmp_path/data`` talking to the fake Hub, quick to retry."""
    def make(data_dir: Path | None = None, **kwargs) -> DownloadManager:
        kwargs = {"max_retries": 2, "retry_wait": 0.001, "progress_interval": 0.0, **kwargs}
        return DownloadManager(data_dir or tmp_path / "data", HubClient(), **kwargs)
    return make
