"""``/v1/messages`` through the official ``anthropic`` client: replies, system prompts, stop sequences, streaming
events and the Anthropic error object."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from .conftest import MODEL_NAME
from .test_openai_api import GREEDY

SYSTEM = "You are a helpful assistant."
QUESTION = "Name three colors of the rainbow."


# The anthropic client (2.x) has no temperature argument any more; the server still reads it, sent in extra_body.


@pytest.fixture
def client(live_server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=live_server.base_url, api_key="unused", max_retries=0, timeout=120)


def engine_reply(model, max_tokens):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    events = list(model.generate_ids(model.chat_ids(messages), GREEDY, max_tokens, skip_special=True))
    return "".join(e.text for e in events), events


def test_greedy_message_matches_the_engine(client, reference_model):
    text, events = engine_reply(reference_model, 24)
    reply = client.messages.create(model=MODEL_NAME, max_tokens=24, extra_body={"temperature": 0}, system=SYSTEM,
                                   messages=[{"role": "user", "content": QUESTION}])
    assert reply.type == "message" and reply.role == "assistant"
    assert reply.content[0].type == "text" and reply.content[0].text == text
    assert reply.stop_reason == ("max_tokens" if events[-1].finish_reason == "length" else "end_turn")
    assert reply.usage.output_tokens == len(events)


def test_stop_sequence_is_reported(client, reference_model):
    text, _ = engine_reply(reference_model, 24)
    word = text.split()[1]
    reply = client.messages.create(model=MODEL_NAME, max_tokens=24, extra_body={"temperature": 0}, system=SYSTEM,
                                   stop_sequences=["zzzz", word], messages=[{"role": "user", "content": QUESTION}])
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence == word
    assert reply.content[0].text == text[:text.index(word)]


def test_streaming_events(client, reference_model):
    text, events = engine_reply(reference_model, 16)
    with client.messages.stream(model=MODEL_NAME, max_tokens=16, extra_body={"temperature": 0},
                                system=[{"type": "text", "text": SYSTEM}],
                                messages=[{"role": "user", "content": [{"type": "text", "text": QUESTION}]}]) as s:
        kinds = [event.type for event in s]
        final = s.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "content_block_stop" in kinds and "message_delta" in kinds
    assert final.content[0].text == text
    assert final.usage.output_tokens == len(events)


def test_errors_use_the_anthropic_format(client, live_server):
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="nope", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "not_found_error"
    r = httpx.post(live_server.base_url + "/v1/messages", content=b'{"model": "smollm2", "messages": []}',
                   headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=MODEL_NAME, max_tokens=100_000, messages=[{"role": "user", "content": "hi"}])
