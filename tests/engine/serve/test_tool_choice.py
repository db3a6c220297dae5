"""``tool_choice`` that forces a call (OpenAI ``required`` or a named function, Anthropic ``any`` or a named
tool): constrained decoding makes the reply one well-formed call, in the template's own syntax, whatever the
model would have said."""

from __future__ import annotations

import json

import anthropic
import jsonschema
import openai
import pytest

from .conftest import MODEL_NAME

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Time in a city", "parameters": {
             "type": "object", "properties": {"city": {"type": "string", "maxLength": 40}}, "required": ["city"]}}}]
ASK = [{"role": "user", "content": "Tell me a joke about cats."}]  # a question no tool answers


def client_for(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0, timeout=300)


@pytest.mark.parametrize("server_name, model", [("qwen_server", "qwen2.5-coder"), ("live_server", MODEL_NAME)])
def test_a_named_function_is_called_with_arguments_that_match_its_schema(request, server_name, model):
    client = client_for(request.getfixturevalue(server_name))
    reply = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, max_tokens=120, temperature=0,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)


def test_required_calls_one_of_the_tools(qwen_server):
    client = client_for(qwen_server)
    reply = client.chat.completions.create(model="qwen2.5-coder", messages=ASK, tools=TOOLS, max_tokens=120,
                                           temperature=0, tool_choice="required")
    [call] = reply.choices[0].message.tool_calls
    assert call.function.name in ("get_weather", "get_time") and isinstance(json.loads(call.function.arguments), dict)


def test_forcing_a_tool_that_does_not_exist_or_without_tools_is_a_400(live_server):
    client = client_for(live_server)
    with pytest.raises(openai.BadRequestError, match="not one of the tools"):
        client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS,
                                       tool_choice={"type": "function", "function": {"name": "nope"}})
    with pytest.raises(openai.BadRequestError, match="has no tools"):
        client.chat.completions.create(model=MODEL_NAME, messages=ASK, tool_choice="required")
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS, tool_choice="sometimes")


def test_anthropic_tool_choice_tool_forces_a_tool_use_block(qwen_server):
    client = anthropic.Anthropic(base_url=qwen_server.base_url, api_key="none", max_retries=0, timeout=300)
    tools = [{"name": f["function"]["name"], "description": f["function"]["description"],
              "input_schema": f["function"]["parameters"]} for f in TOOLS]
    reply = client.messages.create(model="qwen2.5-coder", max_tokens=120, messages=ASK, tools=tools,
                                   tool_choice={"type": "tool", "name": "get_weather"})
    assert reply.stop_reason == "tool_use"
    [block] = [b for b in reply.content if b.type == "tool_use"]
    assert block.name == "get_weather"
    jsonschema.validate(block.input, WEATHER)


def test_a_forced_call_streams_its_arguments_in_pieces_in_both_apis(qwen_server):
    client = client_for(qwen_server)
    chunks = list(client.chat.completions.create(
        model="qwen2.5-coder", messages=ASK, tools=TOOLS, max_tokens=120, temperature=0, stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}))
    deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])] if chunks else []
    assert deltas[0].id.startswith("call_") and deltas[0].function.name == "get_weather"
    pieces = [d.function.arguments for d in deltas if d.function.arguments]
    assert len(pieces) > 3 and all(d.index == 0 for d in deltas)
    jsonschema.validate(json.loads("".join(pieces)), WEATHER)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    anthropic_client = anthropic.Anthropic(base_url=qwen_server.base_url, api_key="none", max_retries=0, timeout=300)
    tools = [{"name": f["function"]["name"], "description": f["function"]["description"],
              "input_schema": f["function"]["parameters"]} for f in TOOLS]
    with anthropic_client.messages.stream(model="qwen2.5-coder", max_tokens=120, messages=ASK, tools=tools,
                                          tool_choice={"type": "tool", "name": "get_weather"}) as stream:
        kinds = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert kinds.count("input_json_delta") > 3 and final.stop_reason == "tool_use"
    [block] = [b for b in final.content if b.type == "tool_use"]
    assert block.name == "get_weather"
    jsonschema.validate(block.input, WEATHER)
