"""The tool-call parsers, one per syntax, on hand-written model output."""

from __future__ import annotations

from engine.serve.tool_calls import parse_tool_calls, template_messages_with_calls


def test_hermes_blocks():
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n' \
           '<tool_call>{"name": "now", "arguments": {}}</tool_call>'
    content, calls = parse_tool_calls(text)
    assert content == "Let me check."
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", {"city": "Paris"}), ("now", {})]
    assert calls[0].id != calls[1].id and calls[0].id.startswith("call_")


def test_an_unclosed_hermes_block_at_the_end_still_parses():
    _, calls = parse_tool_calls('<tool_call>\n{"name": "f", "arguments": "{\\"x\\": 1}"}')
    assert [(c.name, c.arguments) for c in calls] == [("f", {"x": 1})]


def test_malformed_calls_stay_text():
    for text in ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', "<tool_call>not json</tool_call>",
                 '{"answer": 42}', "[TOOL_CALLS] nope"):
        assert parse_tool_calls(text) == (text, [])


def test_mistral_and_llama3_syntax():
    content, calls = parse_tool_calls('[TOOL_CALLS][{"name": "a", "arguments": {"q": 1}}, {"name": "b", "arguments": {}}]')
    assert content == "" and [c.name for c in calls] == ["a", "b"]
    content, calls = parse_tool_calls(' {"name": "search", "parameters": {"q": "cats"}} ')
    assert content == "" and calls[0].arguments == {"q": "cats"}


def test_history_arguments_become_objects_for_the_template():
    messages = [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 2}'}}]}]
    assert template_messages_with_calls(messages)[0]["tool_calls"][0]["function"]["arguments"] == {"x": 2}
    assert messages[0]["tool_calls"][0]["function"]["arguments"] == '{"x": 2}'  # the input is left alone
