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

from .conftest import MODEL_NAME, N_CTX

PROMPT = "The history of tea begins"
MAX_TOKENS = 48
OTHERS = 7


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


@pytest.fixture
def client(live_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=live_server.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)


def test_greedy_api_tokens_are_the_cli_tokens_alone(client, cli_ids):
    assert api_ids(client) == cli_ids


def test_greedy_api_tokens_are_the_cli_tokens_while_seven_other_requests_stream(client, live_server, cli_ids):
    started, texts = threading.Barrier(OTHERS + 1), {}

    def stream(i: int) -> None:
        chunks = client.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": f"Write a story about the number {i}."}],
            max_tokens=96, temperature=0.7, seed=i, stream=True)
        first = True
        for chunk in chunks:
            if first:
                started.wait(timeout=120)
                first = False
            texts[i] = texts.get(i, "") + "".join(c.delta.content or "" for c in chunk.choices)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(OTHERS)]
    for t in threads:
        t.start()
    started.wait(timeout=120)  # every other request is streaming now
    assert live_server.served.active == OTHERS
    ids = api_ids(client)
    running_after = live_server.served.active
    for t in threads:
        t.join(timeout=300)
    assert ids == cli_ids
    assert running_after > 1  # the greedy request decoded in batches with the others, not after them
    assert len(texts) == OTHERS and all(texts.values())
