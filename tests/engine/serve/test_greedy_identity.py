"""Greedy output through the API is token-identical to ``python -m engine generate`` on the same prompt and
settings, alone and while 7 other requests stream (the issue's acceptance)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import openai
import pytest

from tests.model_store import model_path
from tests.openai_sdk import build_sdk_models

from .conftest import MODEL_NAME, N_CTX

PROMPT = "The history of tea begins"
MAX_TOKENS = 48
OTHERS = 7
STALL_GUARD_S = 600  # ends a hang; nothing here is expected to take more than seconds


@pytest.fixture(scope="module")
def cli_ids() -> list[int]:
    done = subprocess.run([sys.executable, "-m", "engine", "generate", str(model_path("smollm2")), "--prompt", PROMPT,
                           "--temperature", "0", "--max-tokens", str(MAX_TOKENS), "--backend", "cpu", "--n-ctx",
                           str(N_CTX), "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["generated_tokens"] == len(out["ids"]) > 8
    return out["ids"]


def api_ids(client: openai.OpenAI) -> list[int]:
    reply = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                                      extra_body={"return_token_ids": True})
    return reply.choices[0].model_extra["token_ids"]


def _client(live_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=live_server.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture
def client(live_server) -> openai.OpenAI:
    return _client(live_server)


def test_greedy_api_tokens_are_the_cli_tokens_alone(client, cli_ids):
    assert api_ids(client) == cli_ids


def test_greedy_api_tokens_are_the_cli_tokens_while_seven_other_requests_stream(client, live_server, cli_ids):
    """Seven sampled chat streams are all running (each read its first chunk and holds) when the greedy request is
    sent; they read on once it is answered. Each stream has a client of its own, and a stream that fails fails
    the test with its own error."""
    lock, started, texts, errors = threading.Condition(), set(), {}, {}
    greedy_done = threading.Event()

    def stream(i: int) -> None:
        try:
            with _client(live_server) as own:
                chunks = own.chat.completions.create(
                    model=MODEL_NAME, messages=[{"role": "user", "content": f"Write a story about the number {i}."}],
                    max_tokens=96, temperature=0.7, seed=i, stream=True)
                for chunk in chunks:
                    if i not in started:
                        with lock:
                            started.add(i)
                            lock.notify_all()
                        greedy_done.wait(STALL_GUARD_S)
                    texts[i] = texts.get(i, "") + "".join(c.delta.content or "" for c in chunk.choices)
        except BaseException as e:  # noqa: BLE001 - re-raised on the test's thread
            with lock:
                errors[i] = e
                lock.notify_all()

    build_sdk_models()  # before threads parse responses at once
    threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(OTHERS)]
    for t in threads:
        t.start()
    try:
        with lock:  # every other request is streaming now (the guard only ends a hang)
            lock.wait_for(lambda: len(started) + len(errors) == OTHERS, timeout=STALL_GUARD_S)
        for i, e in errors.items():
            raise AssertionError(f"stream {i} failed before the greedy request was sent: {e!r}") from e
        assert len(started) == OTHERS, (f"streams {sorted(set(range(OTHERS)) - started)} had no first chunk after "
                                        f"{STALL_GUARD_S} s; {live_server.served.active} requests active")
        assert live_server.served.active == OTHERS
        ids = api_ids(client)
        running_after = live_server.served.active
    finally:
        greedy_done.set()
        for t in threads:
            t.join(timeout=STALL_GUARD_S)
    assert ids == cli_ids
    assert running_after > 1  # the greedy request decoded in batches with the others, not after them
    assert not errors, errors
    assert len(texts) == OTHERS and all(texts.values())
