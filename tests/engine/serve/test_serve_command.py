"""``hearth serve`` as a process: it loads the model, answers on the port it was given, and stops on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx
import openai

from tests.model_store import model_path

from .conftest import _free_port


def test_hearth_serve_answers_and_stops():
    port = _free_port()
    process = subprocess.Popen([sys.executable, "-m", "app", "serve", "--model", str(model_path("smollm2")),
                                "--port", str(port), "--backend", "cpu", "--n-ctx", "512", "--name", "smol",
                                "--api-key", "k3y"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline, health = time.monotonic() + 120, None
        while time.monotonic() < deadline and process.poll() is None:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).json()
                break
            except httpx.TransportError:
                time.sleep(0.2)
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
