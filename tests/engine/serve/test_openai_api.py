"""The OpenAI endpoints driven by the official ``openai`` client against SmolLM2: output, streaming, logprobs,
usage, greedy identity with the engine alone and under load, and the API's error objects."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

from engine.sampling import SamplingParams
from tests.openai_sdk import build_sdk_models

from .conftest import MODEL_NAME

GREEDY = SamplingParams(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0)
MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Name three colors of the rainbow."}]


@pytest.fixture
def client(live_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=live_server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def engine_reply(model, messages, max_tokens):
    events = list(model.generate_ids(model.chat_ids(messages), GREEDY, max_tokens, skip_special=True))
    return "".join(e.text for e in events), events


def test_models_lists_the_served_model(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]
    assert models.data[0].object == "model"


def test_greedy_chat_matches_the_engine(client, reference_model):
    text, events = engine_reply(reference_model, MESSAGES, 24)
    reply = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, temperature=0, max_tokens=24,
                                           logprobs=True)
    choice = reply.choices[0]
    assert choice.message.content == text
    assert choice.message.role == "assistant"
    assert choice.finish_reason == ("length" if events[-1].finish_reason == "length" else "stop")
    assert reply.usage.completion_tokens == len(events)
    assert reply.usage.prompt_tokens == len(reference_model.chat_ids(MESSAGES))
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert 0 <= reply.usage.prompt_tokens_details.cached_tokens < reply.usage.prompt_tokens
    got = [(t.token, t.logprob) for t in choice.logprobs.content]
    want = [(reference_model.tokenizer.decode([e.id]), e.logprob) for e in events]
    assert [g[0] for g in got] == [w[0] for w in want]
    assert [g[1] for g in got] == pytest.approx([w[1] for w in want], abs=1e-4)


def test_streaming_chat_gives_the_same_text_and_usage(client, reference_model):
    text, events = engine_reply(reference_model, MESSAGES, 20)
    stream = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, temperature=0, max_tokens=20,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length" if events[-1].finish_reason == "length" else "stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(events)
    assert len({c.id for c in chunks}) == 1 and chunks[0].object == "chat.completion.chunk"


def test_greedy_output_is_unchanged_while_seven_other_requests_stream(client, reference_model):
    text, _ = engine_reply(reference_model, MESSAGES, 32)
    others, errors = [], []

    def stream_other(i):
        try:
            messages = [{"role": "user", "content": f"Count from {i} to {i + 20}."}]
            s = client.chat.completions.create(model=MODEL_NAME, messages=messages, temperature=0.7, seed=i,
                                               max_tokens=40, stream=True)
            others.append("".join(c.choices[0].delta.content or "" for c in s if c.choices))
        except Exception as e:  # noqa: BLE001 - collected and asserted on below
            errors.append(e)

    build_sdk_models()  # before threads parse responses at once
    threads = [threading.Thread(target=stream_other, args=(i,)) for i in range(7)]
    for t in threads:
        t.start()
    reply = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, temperature=0, max_tokens=32)
    for t in threads:
        t.join(timeout=120)
    assert not errors
    assert len(others) == 7 and all(others)
    assert reply.choices[0].message.content == text


def test_stop_string_ends_the_reply_before_it(client, reference_model):
    text, _ = engine_reply(reference_model, MESSAGES, 24)
    word = text.split()[1]
    reply = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, temperature=0, max_tokens=24,
                                           stop=[word])
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].message.content == text[:text.index(word)]


def test_max_completion_tokens_limits_the_reply(client):
    reply = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, temperature=0,
                                           max_completion_tokens=3)
    assert reply.usage.completion_tokens == 3
    assert reply.choices[0].finish_reason == "length"


def test_seeded_sampling_repeats(client):
    kwargs = dict(model=MODEL_NAME, messages=MESSAGES, temperature=0.9, top_p=0.9, seed=1234, max_tokens=16,
                  presence_penalty=0.5, frequency_penalty=0.2)
    first = client.chat.completions.create(**kwargs).choices[0].message.content
    assert client.chat.completions.create(**kwargs).choices[0].message.content == first


def test_unknown_model_is_a_404_error_object(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES)
    assert e.value.body["code"] == "model_not_found"


def test_max_tokens_beyond_the_context_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=10_000)
    assert e.value.body["code"] == "context_length_exceeded"
    assert e.value.body["type"] == "invalid_request_error"


@pytest.mark.parametrize("body, status", [
    (b"{not json", 400),
    (b"[1, 2]", 400),
    (b'{"model": "smollm2", "messages": "hello"}', 400),
    (b'{"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": "ten"}', 400),
    (b'{"model": "smollm2", "messages": [{"role": "wizard", "content": "hi"}]}', 400),
    (b'{"model": "smollm2", "messages": []}', 400),
    (b'{"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "temperature": -1}', 400),
    (b'{"messages": [{"role": "user", "content": "hi"}]}', 400),
])
def test_bad_bodies_get_an_openai_error_object(live_server, body, status):
    r = httpx.post(live_server.base_url + "/v1/chat/completions", content=body,
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == status
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]


def test_a_10_mb_body_is_refused_with_413(live_server):
    body = b'{"model": "smollm2", "messages": [{"role": "user", "content": "' + b"a" * (10 << 20) + b'"}]}'
    r = httpx.post(live_server.base_url + "/v1/chat/completions", content=body,
                   headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 413
    assert "exceeds" in r.json()["error"]["message"]


def test_unknown_route_and_method_get_error_objects(live_server):
    assert httpx.get(live_server.base_url + "/v2/nothing").json()["error"]["message"]
    r = httpx.get(live_server.base_url + "/v1/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["message"]


def test_a_client_leaving_mid_stream_cancels_its_request(live_server, client):
    stream = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, temperature=0, max_tokens=400,
                                            stream=True)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    served = live_server.served
    deadline = time.monotonic() + 3  # 400 tokens take far longer
    while (served.active or served.host.model.scheduler.has_work) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert served.active == 0
    assert not served.host.model.scheduler.has_work
    assert client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=2).choices


def test_a_full_queue_answers_429_with_retry_after(live_server, client):
    served = live_server.served
    saved, served.max_queue = served.max_queue, 0
    try:
        with pytest.raises(openai.RateLimitError) as e:
            client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=2)
    finally:
        served.max_queue = saved
    assert e.value.response.headers["retry-after"] == "1"


def test_health_and_metrics(live_server, client):
    client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=2)
    health = httpx.get(live_server.base_url + "/health").json()
    assert health["status"] == "ok" and health["model"] == MODEL_NAME
    metrics = httpx.get(live_server.base_url + "/metrics").text
    assert 'hearth_requests_total{endpoint="chat",status="200"}' in metrics
    completion_line = next(l for l in metrics.splitlines() if l.startswith("hearth_completion_tokens_total "))
    assert int(completion_line.split()[1]) >= 2
    values = dict(line.split() for line in metrics.splitlines() if line and not line.startswith("#")
                  and "{" not in line)
    assert float(values["hearth_time_to_first_token_seconds_sum"]) > 0
    assert int(values["hearth_time_to_first_token_seconds_count"]) >= 1


def test_a_shared_system_prompt_is_computed_once(client, reference_model):
    system = {"role": "system", "content": "You are a careful assistant for a bakery. " * 12}
    first_q = [system, {"role": "user", "content": "What is sourdough?"}]
    second_q = [system, {"role": "user", "content": "How long does bread keep?"}]
    client.chat.completions.create(model=MODEL_NAME, messages=first_q, temperature=0, max_tokens=4)
    reply = client.chat.completions.create(model=MODEL_NAME, messages=second_q, temperature=0, max_tokens=16)
    n_system = len(reference_model.chat_ids([system], add_generation_prompt=False))
    assert reply.usage.prompt_tokens_details.cached_tokens >= n_system - 2
    assert reply.choices[0].message.content == engine_reply(reference_model, second_q, 16)[0]


def test_top_logprobs_hold_the_greedy_choice_first(client, reference_model):
    _, events = engine_reply(reference_model, MESSAGES, 8)
    reply = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, temperature=0, max_tokens=8,
                                           logprobs=True, top_logprobs=3)
    for step, event in zip(reply.choices[0].logprobs.content, events):
        assert len(step.top_logprobs) == 3
        assert step.top_logprobs[0].token == step.token  # greedy takes the most likely token
        assert step.top_logprobs[0].logprob == pytest.approx(event.logprob, abs=1e-4)
        assert [t.logprob for t in step.top_logprobs] == sorted((t.logprob for t in step.top_logprobs), reverse=True)
    streamed = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, temperature=0, max_tokens=4,
                                              logprobs=True, top_logprobs=2, stream=True)
    steps = [c.choices[0].logprobs.content[0] for c in streamed if c.choices and c.choices[0].logprobs]
    assert len(steps) == 4 and all(len(s.top_logprobs) == 2 for s in steps)


def test_a_slow_reader_gets_the_whole_stream(live_server, reference_model):
    text, _ = engine_reply(reference_model, MESSAGES, 20)
    body = {"model": MODEL_NAME, "messages": MESSAGES, "temperature": 0, "max_tokens": 20, "stream": True}
    pieces, lines = [], []
    with httpx.stream("POST", live_server.base_url + "/v1/chat/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            time.sleep(0.05)  # the server generates on; the stream waits for the reader
            lines.append(line)
            if line.startswith("data: {"):
                pieces.extend(c["delta"].get("content", "") for c in json.loads(line[6:])["choices"])
    assert [x for x in lines if x][-1] == "data: [DONE]"
    assert "".join(pieces) == text
