"""``hearth serve`` as a process: it loads the model, answers on the port it was given, and stops on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys

import openai

from tests.model_store import model_path

from .conftest import start_hearth_serve


def test_hearth_serve_answers_and_stops():
    process, port, health = start_hearth_serve("--model", str(model_path("smollm2")), "--backend", "cpu",
                                               "--n-ctx", "512", "--name", "smol", "--api-key", "k3y")
    try:
        assert health == {"status": "ok", "model": "smol", "active_requests": 0}
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k3y", max_retries=0)
        reply = client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "Hi"}],
                                               max_tokens=4, temperature=0)
        assert reply.usage.completion_tokens >= 1
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    assert process.returncode in (0, -signal.SIGTERM), err  # uvicorn re-raises the signal after a clean shutdown
    assert "Traceback" not in err
    assert f"serving smol at http://127.0.0.1:{port}/v1" in err


def test_hearth_serve_keeps_a_q8_0_cache_when_asked():
    """--kv-type q8_0 reaches the model: its greedy reply is the engine's own with that cache."""
    import engine.model

    process, port, _ = start_hearth_serve("--model", str(model_path("smollm2")), "--backend", "cpu", "--n-ctx", "512",
                                          "--name", "smol", "--kv-type", "q8_0")
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        reply = client.completions.create(model="smol", prompt="The capital of France is", max_tokens=12,
                                          temperature=0)
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
    model = engine.model.load(model_path("smollm2"), backend="cpu", n_ctx=512, kv_type="q8_0")
    try:
        assert model.backend.kv_type == "q8_0"
        want = "".join(ev.text for ev in model.generate("The capital of France is", max_tokens=12, temperature=0.0))
    finally:
        model.close()
    assert reply.choices[0].text == want


def test_hearth_serve_refuses_a_kv_type_for_a_library():
    done = subprocess.run([sys.executable, "-m", "app", "serve", "--library", "--kv-type", "q8_0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "--kv-type applies to a single model" in done.stderr
    assert "Traceback" not in done.stderr
