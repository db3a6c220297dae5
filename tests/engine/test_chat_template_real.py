"""Real models' chat templates (llama.cpp's ``models/templates``) rendered by Hearth's sandbox and by plain Jinja2
set up as HF transformers' ``apply_chat_template`` sets it up: the prompts must be identical, character for character.
"""

from __future__ import annotations

import json

import jinja2
import pytest
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

import engine.chat_template
from engine.chat_template import ChatTemplate, TemplateError
from tests.llama_cpp_sources import llama_cpp_tree

FAMILIES = (
    "Qwen-Qwen3-0.6B", "Qwen3.5-4B", "HuggingFaceTB-SmolLM3-3B", "google-gemma-2-2b-it",
    "microsoft-Phi-3.5-mini-instruct", "Mistral-Small-3.2-24B-Instruct-2506",
    "mistralai-Ministral-3-14B-Reasoning-2512",
    "ibm-granite-granite-3.3-2B-Instruct", "ibm-granite-granite-4.0", "meta-llama-Llama-3.1-8B-Instruct",
    "meta-llama-Llama-3.2-3B-Instruct", "meta-llama-Llama-3.3-70B-Instruct", "openai-gpt-oss-120b",
)
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "What is 2+2? Answer with \"quotes\" & <tags>."},
]
# A previous reply that kept its reasoning in the content: thinking templates strip or keep it by their own rules.
WITH_THOUGHT = CONVERSATION[:2] + [
    {"role": "assistant", "content": "<think>\nThe user greets me.\n</think>\n\nHello!"}] + CONVERSATION[3:]
FIXED_NOW = "26 Nov 2026"


class _Generation(Extension):
    """HF's ``{% generation %}`` marker, which renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _raise(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _reference_render(source: str, messages: list[dict], **extra) -> str:
    """HF transformers' chat-template environment: immutable sandbox, trim/lstrip blocks, loop controls,
    ``raise_exception``, ``strftime_now`` and a plain-JSON ``tojson``."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise, strftime_now=lambda fmt: FIXED_NOW)
    return env.from_string(source).render(messages=messages, add_generation_prompt=True, bos_token="<s>",
                                          eos_token="</s>", tools=None, **extra)


def _names() -> list[str]:
    return sorted(p.stem for p in (llama_cpp_tree() / "models" / "templates").glob("*.jinja"))


def _source(name: str) -> str:
    return (llama_cpp_tree() / "models" / "templates" / f"{name}.jinja").read_text(encoding="utf-8")


def _both(name: str, messages: list[dict], monkeypatch, **extra) -> tuple[str, str]:
    """(reference, Hearth) renders, or ``"error: ..."`` for either when the template refuses the conversation."""
    monkeypatch.setattr(engine.chat_template, "_strftime_now", lambda fmt: FIXED_NOW)
    source = _source(name)
    try:
        expected = _reference_render(source, messages, **extra)
    except Exception as e:  # the template's own refusal, e.g. Gemma's "System role not supported"
        expected = f"error: {e}"
    try:
        got = ChatTemplate(source, bos_token="<s>", eos_token="</s>").render(messages, **extra)
    except TemplateError as e:
        got = f"error: {e}"
    if expected.startswith("error: ") and got.startswith("error: "):
        return expected[:7], got[:7]  # both refused; the wording of a Python error differs by design
    return expected, got


def _thinking_switches(name: str) -> list[dict]:
    return [{}, {"enable_thinking": True}, {"enable_thinking": False}] if "enable_thinking" in _source(name) else [{}]


def test_the_families_templates_are_in_the_tree() -> None:
    assert set(FAMILIES) <= set(_names())


@pytest.mark.parametrize("name", _names())
def test_real_template_renders_like_hf(name: str, monkeypatch) -> None:
    for extra in _thinking_switches(name):
        for messages in (CONVERSATION, WITH_THOUGHT, CONVERSATION[1:]):
            expected, got = _both(name, messages, monkeypatch, **extra)
            assert got == expected, (extra, messages[-2]["content"])


@pytest.mark.parametrize("name", FAMILIES)
def test_family_templates_render_the_whole_conversation(name: str, monkeypatch) -> None:
    messages = CONVERSATION if name != "google-gemma-2-2b-it" else CONVERSATION[1:]  # Gemma 2 refuses a system turn
    _, got = _both(name, messages, monkeypatch)
    assert all(m["content"] in got for m in messages[1:] if m["role"] == "user"), got


@pytest.mark.parametrize("name", ("Qwen-Qwen3-0.6B", "HuggingFaceTB-SmolLM3-3B", "Qwen3.5-4B"))
def test_enable_thinking_changes_the_prompt(name: str, monkeypatch) -> None:
    on = _both(name, CONVERSATION, monkeypatch, enable_thinking=True)[1]
    off = _both(name, CONVERSATION, monkeypatch, enable_thinking=False)[1]
    assert on != off
