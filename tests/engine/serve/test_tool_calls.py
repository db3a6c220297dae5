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


def _split(text: str, seed: int) -> list[str]:
    import random
    r, pieces, i = random.Random(seed), [], 0
    while i < len(text):
        n = r.randint(1, 6)
        pieces.append(text[i:i + n])
        i += n
    return pieces


def _streamed(pieces: list[str], bare_json: bool = True):
    from engine.serve.tool_calls import ToolCallStream
    stream, out = ToolCallStream(bare_json), []
    for piece in pieces:
        out += stream.feed(piece)
    out += stream.finish()
    arguments: dict[int, str] = {}
    for d in out:
        arguments[d.index] = arguments.get(d.index, "") + d.arguments
    return "".join(d.text for d in out), [d.name for d in out if d.name], arguments, out


def test_calls_stream_in_pieces_that_join_into_their_arguments_however_the_text_is_split():
    import json
    text = 'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris}", "n": {"a": 1}}}\n' \
           '</tool_call>\n<tool_call>{"name": "now", "arguments": {}}</tool_call>'
    for seed in range(40):
        shown, names, arguments, out = _streamed(_split(text, seed))
        assert shown.strip() == "Let me check." and names == ["get_weather", "now"]
        assert json.loads(arguments[0]) == {"city": "Paris}", "n": {"a": 1}} and json.loads(arguments[1] or "{}") == {}
        assert out.index(next(d for d in out if d.name == "get_weather")) < \
            out.index(next(d for d in out if d.arguments and d.index == 0))  # the name comes before its arguments
    assert len([d for d in _streamed(list(text))[3] if d.arguments and d.index == 0]) > 5  # in pieces


def test_a_bare_json_call_and_plain_text_stream_too():
    import json
    _, names, arguments, _ = _streamed(list('{"name": "search", "parameters": {"q": "cats"}}'), bare_json=True)
    assert names == ["search"] and json.loads(arguments[0]) == {"q": "cats"}
    shown, names, _, _ = _streamed(_split("No tools needed: a < b and {x} is fine.", 3), bare_json=True)
    assert shown == "No tools needed: a < b and {x} is fine." and names == []
    shown, names, _, _ = _streamed(_split("Text with <tool_ in it", 1), bare_json=False)
    assert shown == "Text with <tool_ in it" and names == []
