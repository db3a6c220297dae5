"""``response_format`` through the openai client: JSON-schema output enforced by constrained decoding
(llguidance) parses and validates on 20 seeded requests; json_object gives an object; bad schemas get a 400."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from .conftest import MODEL_NAME

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20},
                   "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "colors": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3}},
    "required": ["name", "age", "colors"],
    "additionalProperties": False,
}
MESSAGES = [{"role": "user", "content": "Describe a person as JSON with name, age and favourite colors."}]


@pytest.fixture
def client(live_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=live_server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_json_schema_output_validates_on_20_seeded_requests(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
    replies = []
    for seed in range(20):
        reply = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, temperature=1.0, seed=seed,
                                               max_tokens=120, response_format=fmt)
        assert reply.choices[0].finish_reason == "stop", reply.choices[0].message.content
        document = json.loads(reply.choices[0].message.content)
        jsonschema.validate(document, SCHEMA)
        replies.append(reply.choices[0].message.content)
    assert len(set(replies)) > 1  # seeded sampling still varies within the schema


def test_json_object_gives_an_object(client):
    reply = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, temperature=0, max_tokens=150,
                                           response_format={"type": "json_object"})
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(reply.choices[0].message.content), dict)
    else:  # cut by max_tokens: still a prefix of an object
        assert reply.choices[0].message.content.startswith("{")


@pytest.mark.parametrize("fmt", [
    {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}},
    {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "("}}},
    {"type": "json_schema", "json_schema": "not an object"},
    {"type": "yaml"},
])
def test_invalid_schemas_get_a_400(client, fmt):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=8, response_format=fmt)
    assert e.value.body["param"] == "response_format"
