"""Real servers on loopback — Hearth's ``hearth serve`` and llama.cpp's ``llama-server`` on SmolLM2 — answer the
remote path (``RemoteModel`` and ``python -m engine generate NAME --remote URL``) exactly as they answer the official
``openai`` client for the same greedy request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import openai
import pytest

from engine.remote import Endpoint, RemoteClient, RemoteModel
from engine.sampling import SamplingParams
from engine.scheduler import RequestEvent

from .servers import ROOT, SERVED_NAME
pytestmark = pytest.mark.slow

QUESTION = "Name three primary colours."
MAX_TOKENS = 40
# the CLI's greedy defaults, sent by the remote path; the openai client sends the same fields
SAMPLING = {"temperature": 0.0, "top_p": 0.95, "extra_body": {"top_k": 40, "min_p": 0.05, "repeat_penalty": 1.0}}


def openai_answer(base_url: str) -> str:
    client = openai.OpenAI(base_url=base_url, api_key="none")
    reply = client.chat.completions.create(model=SERVED_NAME, messages=[{"role": "user", "content": QUESTION}],
                                           max_tokens=MAX_TOKENS, **SAMPLING)
    return reply.choices[0].message.content


def cli_answer(base_url: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "engine", "generate", SERVED_NAME, "--remote", base_url, "--chat",
                           QUESTION, "--max-tokens", str(MAX_TOKENS), "--json"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def model_answer(base_url: str) -> tuple[str, object]:
    model = RemoteModel(Endpoint(base_url), SERVED_NAME)
    params = SamplingParams(temperature=0.0, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0)
    _, handle = model.start_chat([{"role": "user", "content": QUESTION}], params, MAX_TOKENS,
                                 cancel=threading.Event())
    text, last = "", None
    while last is None or (not isinstance(last, RequestEvent) and last.finish_reason is None):
        model.scheduler.step()
        for last in handle.ready():
            text += getattr(last, "text", "")
    return text, last


@pytest.mark.parametrize("server", ["hearth_server", "llama_server"])
def test_greedy_answers_match_the_openai_client(server, request):
    base_url = request.getfixturevalue(server)
    expected = openai_answer(base_url)
    assert expected.strip()
    text, last = model_answer(base_url)
    assert text == expected
    assert last.finish_reason in ("stop", "length") and last.generated_tokens > 1 and last.prompt_tokens > 5
    cli = cli_answer(base_url)
    assert cli["text"] == expected and cli["finish_reason"] == last.finish_reason
    assert cli["generated_tokens"] == last.generated_tokens


@pytest.mark.parametrize("server", ["hearth_server", "llama_server"])
def test_listing_and_probe(server, request):
    base_url = request.getfixturevalue(server)
    client = RemoteClient(Endpoint(base_url))
    assert SERVED_NAME in client.list_models()
    caps = client.probe(SERVED_NAME)
    assert caps.streaming and caps.logprobs
    if server == "hearth_server":  # Hearth serves all of these (README: The API server)
        assert caps.tools and caps.json_schema and caps.anthropic_messages
