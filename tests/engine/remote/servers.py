"""Servers on loopback for the remote-engine tests (engine and app): the fake one (its own process, killable),
Hearth's ``hearth serve`` app in a thread, and llama.cpp's ``llama-server``."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import uvicorn

from engine.model import load
from engine.serve.app import create_app
from engine.serve.host import ServedModel
from tests.model_store import model_path

ROOT = Path(__file__).resolve().parents[3]
SERVED_NAME = "smollm2"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, process: subprocess.Popen | None = None, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


class FakeServer:
    """``python -m tests.engine.remote.fake_server`` in a process a test may kill and start again."""

    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None

    def url(self, mode: str) -> str:
        return f"http://127.0.0.1:{self.port}/{mode}/v1"

    def start(self) -> FakeServer:
        self.process = subprocess.Popen([sys.executable, "-m", "tests.engine.remote.fake_server", str(self.port)],
                                        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        wait_ready(f"http://127.0.0.1:{self.port}/stats", self.process, timeout=30)
        return self

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def stats(self) -> dict:
        return httpx.get(f"http://127.0.0.1:{self.port}/stats", timeout=5).json()



@contextlib.contextmanager
def hearth_serve(n_ctx: int = 1024) -> Iterator[str]:
    """``hearth serve``'s app on SmolLM2 (CPU backend) on a loopback port, in a thread; yields its base URL."""
    model = load(model_path("smollm2"), backend="cpu", n_ctx=n_ctx)
    served = ServedModel(model, SERVED_NAME, parallel=4, max_queue=16, timeout_s=120)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(served), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_ready(f"http://127.0.0.1:{port}/health")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        model.close()


@contextlib.contextmanager
def llama_serve() -> Iterator[str]:
    """llama.cpp's own llama-server on SmolLM2, built from the llama-cpp-python sdist's sources; yields its URL."""
    from tests.llama_cpp_tools import tool_path

    port = free_port()
    process = subprocess.Popen([str(tool_path("llama-server")), "-m", str(model_path("smollm2")), "--host",
                                "127.0.0.1", "--port", str(port), "-c", "1024", "-t", "2", "--parallel", "1",
                                "--alias", SERVED_NAME], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(f"http://127.0.0.1:{port}/health", process, timeout=180)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.kill()
        process.wait(timeout=10)
