"""Fuzzing the POST endpoints with seeded mutations of valid bodies: every answer is a 200 or the API's own
error object with a 4xx status, never a 500, a traceback or a hung connection; the server stays healthy."""

from __future__ import annotations

import copy
import json
import random

import httpx
import pytest

BASES = {
    "/v1/chat/completions": {"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
    "/v1/completions": {"model": "smollm2", "prompt": "Hello", "max_tokens": 2},
    "/v1/messages": {"model": "smollm2", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}],
                     "system": "Be brief."},
}
VALUES = [None, True, False, -1, 0, 1, 2, 10 ** 9, -(10 ** 12), 0.5, 3.7, -2.5, "", "x", "smollm2", "\u0000\ud7ff",
          [], [1, 2], [None], ["a", "b", "c", "d", "e"], {}, {"role": "user"}, {"type": "text", "text": 1},
          [{"role": "user", "content": [{"type": "image", "text": None}]}], "a" * 5000]
FIELDS = ["model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
          "min_p", "stop", "stop_sequences", "seed", "n", "stream", "logprobs", "top_logprobs", "system",
          "presence_penalty", "frequency_penalty", "echo", "stream_options", "repeat_penalty"]
CASES = 540


def _mutate(rng: random.Random, base: dict) -> bytes:
    body = copy.deepcopy(base)
    for _ in range(rng.randint(1, 3)):
        kind = rng.random()
        if kind < 0.6:
            body[rng.choice(FIELDS)] = copy.deepcopy(rng.choice(VALUES))
        elif kind < 0.75 and body:
            body.pop(rng.choice(sorted(body)))
        elif kind < 0.9 and isinstance(body.get("messages"), list) and body["messages"]:
            body["messages"][0] = {"role": rng.choice(["user", "assistant", "tool", "bad", 3]),
                                   "content": copy.deepcopy(rng.choice(VALUES))}
    text = json.dumps(body).encode()
    if rng.random() < 0.12:  # broken JSON: cut short or a stray byte
        cut = rng.randrange(len(text))
        text = text[:cut] if rng.random() < 0.5 else text[:cut] + bytes([rng.randrange(256)]) + text[cut:]
    return text


def _check_error_object(path: str, response: httpx.Response) -> None:
    data = response.json()
    if path == "/v1/messages":
        assert data["type"] == "error" and isinstance(data["error"]["message"], str)
    else:
        assert isinstance(data["error"]["message"], str) and data["error"]["type"]


@pytest.mark.timeout(600)
def test_fuzzed_bodies_get_answers_in_the_api_format(live_server):
    rng = random.Random(20261126)
    statuses = []
    with httpx.Client(base_url=live_server.base_url, timeout=60) as http:
        for case in range(CASES):
            path = rng.choice(sorted(BASES))
            body = _mutate(rng, BASES[path])
            response = http.post(path, content=body, headers={"content-type": "application/json"})
            statuses.append(response.status_code)
            assert response.status_code < 500, (case, body[:300], response.text[:300])
            if response.status_code != 200:
                assert 400 <= response.status_code < 500
                _check_error_object(path, response)
            elif "text/event-stream" in response.headers["content-type"]:
                assert response.text.rstrip().endswith(("[DONE]", '{"type":"message_stop"}'))
            else:
                assert response.json()["id"]
        assert http.get("/health").json()["status"] == "ok"
    assert statuses.count(200) >= 20 and len(set(statuses)) >= 2  # the mutations reach both sides
    assert live_server.served.active == 0
