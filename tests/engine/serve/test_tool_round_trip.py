"""Tool calls round-trip through both official clients on Qwen2.5-Coder-0.5B (its chat template renders tools;
SmolLM2's does not): a tool call produced, its result sent back, a final answer."""

from __future__ import annotations

import json

import anthropic
import openai

MODEL = "qwen2.5-coder"
WEATHER = {"name": "get_weather", "description": "Get the current weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
QUESTION = "What is the weather in Paris right now? Use the get_weather tool."


def test_openai_tool_call_round_trip(qwen_server):
    client = openai.OpenAI(base_url=qwen_server.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)
    tools = [{"type": "function", "function": WEATHER}]
    messages = [{"role": "user", "content": QUESTION}]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=tools, temperature=0, max_tokens=80)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    assert "paris" in json.loads(call.function.arguments)["city"].lower()
    messages += [{"role": "assistant", "content": choice.message.content, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 18, "sky": "cloudy"}'}]
    final = client.chat.completions.create(model=MODEL, messages=messages, tools=tools, temperature=0, max_tokens=60)
    assert final.choices[0].finish_reason in ("stop", "length")
    assert not final.choices[0].message.tool_calls
    assert "18" in final.choices[0].message.content
    streamed = list(client.chat.completions.create(model=MODEL, messages=messages[:1], tools=tools, temperature=0,
                                                   max_tokens=80, stream=True))
    deltas = [d for c in streamed for d in (c.choices[0].delta.tool_calls or [])]
    assert deltas and deltas[0].function.name == "get_weather" and deltas[0].id.startswith("call_")
    assert streamed[-1].choices[0].finish_reason == "tool_calls"


def test_anthropic_tool_use_round_trip(qwen_server):
    client = anthropic.Anthropic(base_url=qwen_server.base_url, api_key="unused", max_retries=0, timeout=300)
    tools = [{"name": WEATHER["name"], "description": WEATHER["description"], "input_schema": WEATHER["parameters"]}]
    messages = [{"role": "user", "content": QUESTION}]
    greedy = {"temperature": 0}
    first = client.messages.create(model=MODEL, max_tokens=80, tools=tools, messages=messages, extra_body=greedy)
    assert first.stop_reason == "tool_use"
    use = next(block for block in first.content if block.type == "tool_use")
    assert use.name == "get_weather" and "paris" in use.input["city"].lower()
    messages += [{"role": "assistant", "content": [block.model_dump() for block in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                               "content": '{"temperature_c": 18, "sky": "cloudy"}'}]}]
    final = client.messages.create(model=MODEL, max_tokens=60, tools=tools, messages=messages, extra_body=greedy)
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert "18" in final.content[0].text
    with client.messages.stream(model=MODEL, max_tokens=80, tools=tools, messages=messages[:1],
                                extra_body=greedy) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "tool_use"
    assert [b.input for b in streamed.content if b.type == "tool_use"] == [use.input]
