"""Chat templates: the real models' templates, the built-in fallbacks, HF's globals, and the sandbox's limits."""

from __future__ import annotations

import datetime
import time
import tracemalloc

import pytest

from engine.chat_template import ChatTemplate, TemplateError

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi!"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "What is 2+2?"},
]
CHATML_CONVERSATION = (
    "<|im_start|>system\nYou are terse.<|im_end|>\n"
    "<|im_start|>user\nHi!<|im_end|>\n"
    "<|im_start|>assistant\nHello.<|im_end|>\n"
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
)

# Written for these tests in the Llama 3 header format (bos, header ids, trimmed content, eot).
LLAMA3_STYLE = (
    "{% set loop_messages = messages %}"
    "{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim"
    " + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
LLAMA3_CONVERSATION = (
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
)

# Mistral-style: roles must alternate after an optional system message.
ALTERNATING = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% else %}{{ message['content'] + eos_token }}{% endif %}"
    "{% endfor %}"
)


def _model_template(name: str) -> tuple[ChatTemplate, str | None]:
    from engine.gguf_file import read_gguf
    from tests.model_store import model_path

    with read_gguf(model_path(name)) as gguf:
        meta = gguf.metadata
        tokens = meta["tokenizer.ggml.tokens"]
        return ChatTemplate.for_model(meta, tokens[meta["tokenizer.ggml.bos_token_id"]],
                                      tokens[meta["tokenizer.ggml.eos_token_id"]])


# -- the real templates ------------------------------------------------------------------------------------

@pytest.mark.slow
def test_smollm2_template_renders_chatml():
    template, notice = _model_template("smollm2")
    assert notice is None
    assert template.render(CONVERSATION) == CHATML_CONVERSATION + "<|im_start|>assistant\n"
    assert template.render(CONVERSATION[1:], add_generation_prompt=False) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        + CHATML_CONVERSATION.split("<|im_end|>\n", 1)[1])


@pytest.mark.slow
def test_qwen25_template_renders_chatml_with_its_default_system_prompt():
    template, notice = _model_template("qwen25coder")
    assert notice is None
    assert template.render(CONVERSATION) == CHATML_CONVERSATION + "<|im_start|>assistant\n"
    assert template.render(CONVERSATION[1:]).startswith(
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi!<|im_end|>\n")


@pytest.mark.slow
def test_qwen25_template_with_tools_and_tool_calls():
    template, _ = _model_template("qwen25coder")
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Wetter für eine Stadt <heute>",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Wetter in Köln?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Köln"}}}]},
        {"role": "tool", "content": '{"temp": 12}'},
        {"role": "tool", "content": '{"wind": 3}'},
    ]
    assert template.render(messages, tools=tools) == (
        "<|im_start|>system\nS\n\n# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        '{"type": "function", "function": {"name": "get_weather", "description": "Wetter für eine Stadt <heute>", '
        '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}\n'
        "</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWetter in Köln?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Köln"}}\n'
        "</tool_call><|im_end|>\n"
        '<|im_start|>user\n<tool_response>\n{"temp": 12}\n</tool_response>\n'
        '<tool_response>\n{"wind": 3}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n")


@pytest.mark.slow
def test_gemma3_without_template_falls_back_to_gemma_turns():
    template, notice = _model_template("gemma3")
    assert notice == "The model file has no chat template; using the built-in Gemma format."
    assert template.render(CONVERSATION) == (
        "<bos><start_of_turn>user\nYou are terse.\n\nHi!<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n"
        "<start_of_turn>model\n")


# -- fallbacks chosen from metadata ------------------------------------------------------------------------

@pytest.mark.parametrize("metadata, expected_prefix, name", [
    ({"general.architecture": "gemma2"}, "<s><start_of_turn>user\nYou are terse.\n\nHi!", "Gemma"),
    ({"general.architecture": "qwen2", "tokenizer.ggml.tokens": ["a", "<|im_start|>"]},
     "<|im_start|>system\nYou are terse.<|im_end|>\n", "ChatML"),
    ({"general.architecture": "llama", "tokenizer.ggml.tokens": ["<|start_header_id|>", "<|eot_id|>"]},
     "<s><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>", "Llama 3"),
    ({"general.architecture": "llama", "tokenizer.ggml.tokens": ["<s>", "</s>"]},
     "<|im_start|>system\nYou are terse.<|im_end|>\n", "ChatML"),
    ({}, "<|im_start|>system\n", "ChatML"),
])
def test_fallback_follows_architecture_and_vocabulary(metadata, expected_prefix, name):
    template, notice = ChatTemplate.for_model(metadata, "<s>", "</s>")
    assert notice == f"The model file has no chat template; using the built-in {name} format."
    assert template.render(CONVERSATION).startswith(expected_prefix)


def test_llama3_fallback_renders_the_whole_conversation():
    metadata = {"general.architecture": "llama", "tokenizer.ggml.tokens": ["<|start_header_id|>", "<|eot_id|>"]}
    template, _ = ChatTemplate.for_model(metadata, "<|begin_of_text|>", "<|eot_id|>")
    assert template.render(CONVERSATION) == LLAMA3_CONVERSATION


def test_chatml_fallback_renders_the_whole_conversation():
    template, _ = ChatTemplate.for_model({"general.architecture": "qwen2"}, "", "<|im_end|>")
    assert template.render(CONVERSATION) == CHATML_CONVERSATION + "<|im_start|>assistant\n"
    assert template.render(CONVERSATION, add_generation_prompt=False) == CHATML_CONVERSATION


@pytest.mark.parametrize("source, reason", [
    ("{% for m in messages %}", "syntax error"),
    ("{{ raise_exception('not for chat') }}", "(not for chat)"),
    ("{{ ''.__class__ }}", "refused"),
    ("just text", "leaves the conversation out"),
])
def test_broken_model_template_falls_back_with_the_reason(source, reason):
    metadata = {"general.architecture": "qwen2", "tokenizer.chat_template": source}
    template, notice = ChatTemplate.for_model(metadata, "", "<|im_end|>")
    assert notice.startswith("The model's chat template could not be used (")
    assert reason in notice and notice.endswith("; using the built-in ChatML format.")
    assert template.render(CONVERSATION) == CHATML_CONVERSATION + "<|im_start|>assistant\n"


def test_gemma_fallback_without_a_following_turn_keeps_the_system_text():
    template, _ = ChatTemplate.for_model({"general.architecture": "gemma3"}, "<bos>", "<eos>")
    assert template.render([{"role": "system", "content": "Be brief."}]) == (
        "<bos><start_of_turn>user\nBe brief.<end_of_turn>\n<start_of_turn>model\n")


# -- HF compatibility --------------------------------------------------------------------------------------

def test_llama3_style_template():
    assert ChatTemplate(LLAMA3_STYLE, bos_token="<|begin_of_text|>").render(CONVERSATION) == LLAMA3_CONVERSATION


def test_raise_exception_on_role_alternation_carries_the_templates_message():
    template = ChatTemplate(ALTERNATING, bos_token="<s>", eos_token="</s>")
    assert template.render(CONVERSATION[1:]) == "<s>[INST] Hi! [/INST]Hello.</s>[INST] What is 2+2? [/INST]"
    with pytest.raises(TemplateError) as info:
        template.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    assert str(info.value) == "Conversation roles must alternate user/assistant/user/assistant/..."


def test_tojson_is_plain_json_like_hf():
    value = {"name": "Köln <&>", "quote": "it's", "n": [1, 2]}
    assert ChatTemplate("{{ v | tojson }}").render([], v=value) == \
        '{"name": "Köln <&>", "quote": "it\'s", "n": [1, 2]}'
    assert ChatTemplate("{{ v | tojson(indent=2) }}").render([], v={"a": 1}) == '{\n  "a": 1\n}'
    assert ChatTemplate("{{ v | tojson(ensure_ascii=True) }}").render([], v="ö") == '"\\u00f6"'


def test_globals_filters_and_extensions_templates_use():
    assert ChatTemplate("{{ strftime_now('%Y') }}").render([]) == str(datetime.datetime.now().year)
    loop = "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{{ m.role[0] }}{% endfor %}"
    assert ChatTemplate(loop).render(CONVERSATION) == "su"
    ns = "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}"
    assert ChatTemplate(ns).render(CONVERSATION) == "4"
    assert ChatTemplate("{% generation %}{{ messages[0].content }}{% endgeneration %}").render(CONVERSATION) == \
        "You are terse."
    assert ChatTemplate("{{ messages | map(attribute='role') | join(', ') }}").render(CONVERSATION) == \
        "system, user, assistant, user"
    assert ChatTemplate("{{ 'a-b'.replace('-', '+') }} {{ '%s=%d' % ('x', 3) }} {{ '{}!'.format('y') }}").render([]) \
        == "a+b x=3 y!"
    assert ChatTemplate("{{ (messages | last).content | upper }}").render(CONVERSATION) == "WHAT IS 2+2?"


def test_trim_blocks_lstrip_blocks_and_missing_keys_like_hf():
    source = "{% for m in messages %}\n    {% if m.tool_calls %}T{% endif %}\n{{ m.role }}\n{% endfor %}"
    assert ChatTemplate(source).render(CONVERSATION[:2]) == "system\nuser\n"


def test_extra_variables_reach_the_template():
    source = ("{% if enable_thinking is defined and not enable_thinking %}/no_think{% endif %}"
              "{{ add_generation_prompt }}")
    assert ChatTemplate(source).render([], enable_thinking=False) == "/no_thinkTrue"
    assert ChatTemplate(source).render([], add_generation_prompt=False) == "False"


def test_syntax_error_names_the_line():
    with pytest.raises(TemplateError, match=r"syntax error on line 2: .*"):
        ChatTemplate("ok\n{% if %}")
    with pytest.raises(TemplateError, match="(?i)no filter named 'nope'"):
        ChatTemplate("{{ 1 | nope }}")


def test_runtime_errors_become_template_errors():
    with pytest.raises(TemplateError, match="chat template failed: TypeError"):
        ChatTemplate("{{ 'a' + 1 }}").render([])
    with pytest.raises(TemplateError, match="recursed too deeply"):
        ChatTemplate("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").render([])


def test_ordinary_sizes_stay_allowed():
    big = "x" * 300_000
    chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    assert ChatTemplate(chatml).render([{"role": "user", "content": big}]).count("x") == 300_000
    assert ChatTemplate("{{ ('ab' * 1000) | length }} {{ range(100000) | list | length }}").render([]) == \
        "2000 100000"


# -- limits ------------------------------------------------------------------------------------------------

def test_output_cap_is_exact():
    assert len(ChatTemplate("{{ 'a' * 100 }}", max_output_chars=100).render([])) == 100
    with pytest.raises(TemplateError, match="output exceeds 100 characters"):
        ChatTemplate("{% for i in range(101) %}a{% endfor %}", max_output_chars=100).render([])


def test_deadline_stops_a_slow_render():
    slow = "{% for i in range(1000) %}{% for j in range(900) %}{{ '' }}{% endfor %}{% endfor %}"
    start = time.thread_time()
    with pytest.raises(TemplateError, match="longer than its 0.1 s time limit"):
        ChatTemplate(slow, timeout_s=0.1).render([])
    assert time.thread_time() - start < 2.0  # the limit is CPU time


class _SlowText:
    """Message content that takes wall-clock time to print without computing (as a render starved of the CPU or
    the GIL does)."""

    def __str__(self) -> str:
        time.sleep(0.3)
        return "slow"


def test_deadline_counts_the_renders_cpu_time_not_waiting():
    source = "{% for m in messages %}{{ m['content'] }}|{% endfor %}{% for i in range(3) %}{{ i }}{% endfor %}"
    messages = [{"role": "user", "content": _SlowText()}, {"role": "user", "content": "hi"}]
    assert ChatTemplate(source, timeout_s=0.1).render(messages) == "slow|hi|012"


# CVE-2024-34359-style server-side template injection, and resource bombs. Each must be refused with
# TemplateError (never executed), within 2 s and without allocating more than a bounded amount of memory.
PAYLOADS = {
    "cycler globals": ("{{ cycler.__init__.__globals__.os.popen('id').read() }}", "refused"),
    "lipsum globals": ("{{ lipsum.__globals__['os'].popen('id').read() }}", "refused"),
    "joiner globals": ("{{ joiner.__init__.__globals__ }}", "refused"),
    "namespace class": ("{{ namespace.__init__.__globals__ }}", "refused"),
    "namespace instance": ("{% set ns = namespace() %}{{ ns.__class__.__init__.__globals__ }}", "refused"),
    "namespace internals": ("{% set ns = namespace(a=1) %}{{ ns._Namespace__attrs }}", "refused"),
    "mro": ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "refused"),
    "mro in a test": ("{% if ''.__class__.__mro__ %}x{% endif %}", "refused"),
    "attr filter": ("{{ ''|attr('__class__')|attr('__mro__') }}", "refused"),
    "str.format": ("{{ '{0.__class__.__mro__}'.format('') }}", "refused"),
    "str.format_map": ("{{ '{x.__class__}'.format_map({'x': ''}) }}", "refused"),
    "format width": ("{{ '{:>9999999999}'.format('') }}", "refused"),
    "format nested width": ("{{ '{:>{}}'.format('', 10**10) }}", "refused"),
    "percent width": ("{{ '%099999999999d' % 1 }}", "refused"),
    "percent star": ("{{ '%*d' % (10**10, 1) }}", "refused"),
    "format filter": ("{{ '%09999999999d'|format(1) }}", "refused"),
    "range": ("{{ range(10**10)|list }}", "refused"),
    "string repeat": ("{{ 'A' * 10**10 }}", "refused"),
    "list repeat": ("{{ [1] * 10**10 }}", "refused"),
    "power": ("{{ 10 ** (10 ** 10) }}", "refused"),
    "squaring": ("{% set ns = namespace(x=10**1000) %}{% for i in range(100) %}{% set ns.x = ns.x * ns.x %}"
                 "{% endfor %}{{ ns.x }}", "refused"),
    "nested loops": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                     "loop iterations"),
    "nested loops over a string": ("{% set s = 'A' * 999999 %}{% for c in s %}{% for d in s %}{% endfor %}"
                                   "{% endfor %}", "loop iterations"),
    "huge output": ("{% for i in range(100000) %}{{ 'A' * 50 }}{% endfor %}", "output exceeds"),
    "huge literal output": ("{% for i in range(100000) %}" + "A" * 60 + "{% endfor %}", "output exceeds"),
    "doubling with ~": ("{% set ns = namespace(s='AAAA') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                        "{% endfor %}{{ ns.s|length }}", "refused"),
    "doubling with +": ("{% set ns = namespace(s='AAAA') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
                        "{% endfor %}", "refused"),
    "shared nested lists": ("{% set ns = namespace(x=[1]) %}{% for i in range(64) %}{% set ns.x = [ns.x, ns.x] %}"
                            "{% endfor %}{{ ns.x }}", "refused"),
    "namespace cycle": ("{% set ns = namespace() %}{% set ns.a = ns %}{{ ns }}", "refused"),
    "str.center": ("{{ 'x'.center(10**10) }}", "refused"),
    "center filter": ("{{ 'x'|center(10000000000) }}", "refused"),
    "macro buffer": ("{% macro m() %}{% for i in range(100000) %}{{ 'A' * 1000 }}{% endfor %}{% endmacro %}"
                     "{{ m()|length }}", "refused"),
    "str.replace": ("{{ ('A' * 100000).replace('A', 'B' * 100000) }}", "refused"),
    "replace filter": ("{{ ('A' * 100000)|replace('', 'B' * 100000) }}", "refused"),
    "join filter": ("{{ (range(2000)|map('string')|list)|join('A' * 1000) }}", "refused"),
    "str.join": ("{{ ('A' * 1000).join(range(2000)|map('string')) }}", "refused"),
    "lazy map": ("{{ range(1000)|map('center', 999999)|list|length }}", "refused"),
    "tojson indent": ("{% set ns = namespace(x=[1]) %}{% for i in range(500) %}{% set ns.x = [ns.x] %}{% endfor %}"
                      "{{ ns.x|tojson(indent=100000) }}", "refused"),
    "expandtabs": ("{{ ('\t' * 1000).expandtabs(999999) }}", "refused"),
    "int.to_bytes": ("{{ (1).to_bytes(10**10, 'big') }}", "refused"),
    "dict.fromkeys": ("{{ {}.fromkeys(range(100000), 'A' * 100000) }}", "refused"),
    "batch fill": ("{{ range(10)|batch(10**9, 'x')|list }}", "refused"),
    "indent": ("{{ ('\n' * 500000)|indent(1000) }}", "refused"),
    "include": ("{% include 'x' %}", "no loader"),
    "strftime": ("{{ strftime_now('%c' * 200000) }}", "refused"),
}


@pytest.mark.parametrize("source, kind", PAYLOADS.values(), ids=PAYLOADS.keys())
def test_payload_is_refused_quickly_by_its_limit(source, kind):
    start = time.thread_time()
    with pytest.raises(TemplateError) as info:
        ChatTemplate(source, timeout_s=1.5).render([{"role": "user", "content": "hi"}])
    assert time.thread_time() - start < 2.0  # CPU time, as the limit
    assert kind in str(info.value)  # a size or loop limit stopped it, not the deadline


@pytest.mark.parametrize("source", [source for source, _ in PAYLOADS.values()], ids=PAYLOADS.keys())
def test_payload_is_refused_in_bounded_memory(source):
    tracemalloc.start()
    try:
        with pytest.raises(TemplateError):
            ChatTemplate(source, timeout_s=1.0).render([{"role": "user", "content": "hi"}])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 128 << 20
