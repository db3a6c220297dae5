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


def test_completion_logprobs_are_the_engines_own_with_the_most_likely_tokens_of_each_step(live_server,
                                                                                        reference_model):
    client = openai.OpenAI(base_url=f"{live_server.base_url}/v1", api_key="none", max_retries=0)
    prompt = "The capital of France is"
    reply = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=6, temperature=0, logprobs=3,
                                      extra_body={"return_token_ids": True})
    choice, lp = reply.choices[0], reply.choices[0].logprobs
    ids = choice.model_extra["token_ids"]
    assert choice.model_extra["prompt_token_ids"] == reference_model.tokenize(prompt, True, True)
    expected = list(reference_model.generate_ids(choice.model_extra["prompt_token_ids"], GREEDY, 6))
    assert ids == [e.id for e in expected][:len(ids)] and len(ids) == reply.usage.completion_tokens
    assert lp.tokens == [reference_model.tokenizer.decode([t]) for t in ids]
    assert lp.token_logprobs == pytest.approx([e.logprob for e in expected][:len(ids)], abs=1e-3)
    assert all(len(top) == 3 and max(top.values()) == pytest.approx(chosen, abs=1e-3)  # greedy: the best one
               for top, chosen in zip(lp.top_logprobs, lp.token_logprobs))
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(ids))]
    plain = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=6, temperature=0)
    assert plain.choices[0].logprobs is None and "token_ids" not in plain.choices[0].model_extra
    assert plain.choices[0].text == choice.text
    stream = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=6, temperature=0, logprobs=0,
                                       stream=True, extra_body={"return_token_ids": True})
    chunks = list(stream)
    assert [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens] == lp.tokens
    assert chunks[-1].choices[0].model_extra["token_ids"] == ids
