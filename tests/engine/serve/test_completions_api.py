"""``/v1/completions`` through the official ``openai`` client: a text prompt continued, streaming and not."""

from __future__ import annotations

import openai
import pytest

from .conftest import MODEL_NAME
from .test_openai_api import GREEDY

PROMPT = "The capital of France is"


@pytest.fixture
def client(live_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=live_server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def engine_text(model, max_tokens):
    ids = model.tokenize(PROMPT, add_special=True, parse_special=True)
    events = list(model.generate_ids(ids, GREEDY, max_tokens, skip_special=True))
    return "".join(e.text for e in events), events, len(ids)


def test_greedy_completion_matches_the_engine(client, reference_model):
    text, events, n_prompt = engine_text(reference_model, 16)
    reply = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=16, temperature=0)
    assert reply.object == "text_completion"
    assert reply.choices[0].text == text
    assert reply.usage.prompt_tokens == n_prompt and reply.usage.completion_tokens == len(events)


def test_streaming_completion_and_echo(client, reference_model):
    text, _, _ = engine_text(reference_model, 12)
    chunks = list(client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=12, temperature=0,
                                            stream=True, echo=True))
    assert "".join(c.choices[0].text for c in chunks) == PROMPT + text
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_token_id_prompts_and_bad_ids(client, reference_model):
    ids = reference_model.tokenize(PROMPT, add_special=True, parse_special=True)
    text, _, _ = engine_text(reference_model, 8)
    assert client.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=8, temperature=0).choices[0].text == text
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL_NAME, prompt=[10 ** 9], max_tokens=2)
