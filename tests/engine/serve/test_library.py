"""Library models on demand: the memory check's verdict, the headless LibraryHost's loading and unloading, and
``hearth serve --library`` answering a request for a model it had not loaded."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys

import openai
import pytest

from engine.model import load
from engine.serve.errors import APIError
from engine.serve.library import LibraryHost, load_refusal, model_id
from tests.model_store import model_path

from .conftest import start_hearth_serve


def test_a_model_that_does_not_fit_is_refused_with_its_size_and_what_is_free():
    path = model_path("smollm2")
    assert load_refusal(path, "cpu", 512) is None  # SmolLM2 fits this machine
    reason = load_refusal(path, "cpu", 512, available_bytes=10 << 20)
    assert reason.startswith(f"{model_id(path)} needs about") and "does not fit in memory" in reason
    assert load_refusal(path, "cpu", 512, freed_bytes=4 << 30, available_bytes=10 << 20) is None
    assert "cannot be read" in load_refusal(__file__, "cpu", 512)


@pytest.fixture
def library(tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    shutil.copyfile(model_path("smollm2"), a)
    b.symlink_to(a)
    return {"a": str(a), "b": str(b)}


def test_the_model_a_request_names_is_loaded_and_an_idle_one_makes_room(library):
    active, loads = {}, []

    def loader(path, backend, n_ctx):
        loads.append(path)
        return load(path, backend=backend, n_ctx=n_ctx)

    host = LibraryHost(library, backend="cpu", n_ctx=256, max_resident=1, loader=loader,
                       active=lambda model: active.get(id(model), 0))
    host.start()
    try:
        assert host.model_ids() == ["a", "b"]
        a = host.acquire("a")
        assert host.acquire("a") is a and loads == [library["a"]] and host.is_current(a) and host.error is None
        active[id(a)] = 1  # a request runs on "a": "b" must wait
        with pytest.raises(APIError) as busy:
            host.acquire("b")
        assert busy.value.status == 503 and "while a answer requests" in busy.value.message
        active[id(a)] = 0
        b = host.acquire("b")
        assert not host.is_current(a) and host.is_current(b) and loads == [library["a"], library["b"]]
        with pytest.raises(APIError) as unknown:
            host.acquire("c")
        assert unknown.value.status == 404
    finally:
        host.close()


def test_a_model_the_memory_check_refuses_is_answered_503_with_the_reason(library):
    host = LibraryHost(library, backend="cpu", n_ctx=256, refusal=lambda *a, **k: "b needs about 40.0 GB")
    with pytest.raises(APIError) as refused:
        host.acquire("b")
    assert refused.value.status == 503 and refused.value.message == "b needs about 40.0 GB"
    assert host.model_ids() == ["a", "b"] and not host.is_current(None)


@pytest.mark.slow
def test_hearth_serve_library_lists_the_library_and_loads_the_model_a_request_names(tmp_path):
    data = tmp_path / "data"
    imported = subprocess.run([sys.executable, "-m", "app", "models", "import", str(model_path("smollm2")), "--link",
                               "--data-dir", str(data)], capture_output=True, text=True, timeout=300)
    assert imported.returncode == 0, imported.stderr
    name = model_id(model_path("smollm2"))
    process, port, _ = start_hearth_serve("--library", "--data-dir", str(data), "--backend", "cpu", "--n-ctx", "512")
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        assert name in [m.id for m in client.models.list().data]
        reply = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "Hi"}],
                                               max_tokens=4, temperature=0)
        assert reply.model == name and reply.usage.completion_tokens >= 1
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="not-in-the-library", messages=[{"role": "user", "content": "Hi"}])
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    assert "Traceback" not in err
