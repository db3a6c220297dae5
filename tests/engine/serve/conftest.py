"""Live servers on SmolLM2 and Qwen2.5-Coder (CPU backend) for the API tests: uvicorn on a free loopback port, in a thread."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn

from engine.model import load
from engine.serve.app import create_app
from engine.serve.host import ServedModel
from tests.model_store import model_path

MODEL_NAME = "smollm2"
N_CTX = 1024


class LiveServer:
    def __init__(self, served: ServedModel, base_url: str):
        self.served, self.base_url = served, base_url


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_hearth_serve(*args: str) -> tuple[subprocess.Popen, int, dict | None]:
    """``hearth serve ARGS --port P`` in a child process: (the process, P, its first /health answer, or None when
    it did not answer within 120 s or exited)."""
    port = _free_port()
    process = subprocess.Popen([sys.executable, "-m", "app", "serve", *args, "--port", str(port)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and process.poll() is None:
            try:
                return process, port, httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).json()
            except httpx.TransportError:
                time.sleep(0.2)
    except BaseException:
        process.kill()
        raise
    return process, port, None


def _serve(test_model: str, name: str) -> Iterator[LiveServer]:
    model = load(model_path(test_model), backend="cpu", n_ctx=N_CTX)
    served = ServedModel(model, name, parallel=16, max_queue=32, timeout_s=120)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(served), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.05)
    yield LiveServer(served, f"http://127.0.0.1:{port}")
    server.should_exit = True
    thread.join(timeout=20)


@pytest.fixture(scope="package")
def live_server() -> Iterator[LiveServer]:
    yield from _serve("smollm2", MODEL_NAME)


@pytest.fixture(scope="package")
def qwen_server() -> Iterator[LiveServer]:
    """Qwen2.5-Coder-0.5B-Instruct, whose chat template renders tools (SmolLM2's does not)."""
    yield from _serve("qwen25coder", "qwen2.5-coder")


@pytest.fixture(scope="package")
def reference_model():
    """A second copy of the model, stepped on the test's thread, to compare the API's output with."""
    return load(model_path("smollm2"), backend="cpu", n_ctx=N_CTX)
