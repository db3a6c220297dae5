"""Fixtures for the remote-engine tests: the fake server (its own process, killable), ``hearth serve`` and
``llama-server`` on SmolLM2 (tests/engine/remote/servers.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .servers import FakeServer, hearth_serve, llama_serve


@pytest.fixture
def fake_server() -> Iterator[FakeServer]:
    server = FakeServer().start()
    yield server
    server.kill()


@pytest.fixture(scope="session")
def hearth_server() -> Iterator[str]:
    with hearth_serve() as url:
        yield url


@pytest.fixture(scope="session")
def llama_server() -> Iterator[str]:
    with llama_serve() as url:
        yield url
