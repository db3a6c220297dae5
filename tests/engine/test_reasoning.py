"""Splitting a reply into thinking and answer as it streams, counting thinking tokens, and templates' profiles."""

from __future__ import annotations

import random

import numpy as np
import pytest

from engine.chat_template import ChatTemplate
from engine.gguf_file import read_gguf
from engine.reasoning import (HARMONY, MISTRAL, THINK, ReasoningProfile, ReasoningSplitter, Split,
                              count_thinking_tokens, detect_syntax, profile_of, prompt_opens_thinking, thinking_stats)
from engine.tokenizer import Tokenizer
from engine.vocab import load_vocab
from tests.llama_cpp_sources import chat_template, vocab_file

QWEN_REPLY = "<think>\nThe user asks 2+2.\nThat is 4.\n</think>\n\nIt is **4**."
HARMONY_REPLY = ("<|channel|>analysis<|message|>User asks 2+2. Simple.<|end|><|start|>assistant<|channel|>final"
                 "<|message|>It is 4.")


def _split(pieces, syntax, starts_in_thinking=False) -> Split:
    splitter = ReasoningSplitter(syntax, starts_in_thinking)
    for piece in pieces:
        splitter.feed(piece)
    splitter.finish()
    return splitter.split()


def _chunkings(text: str, n: int, seed: int = 0):
    """Every cut into two pieces, and ``n`` random cuts into many (markers split anywhere)."""
    for i in range(len(text) + 1):
        yield [text[:i], text[i:]]
    rng = random.Random(seed)
    for _ in range(n):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, len(text) // 2)))
        yield [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


def test_think_reply_splits_into_thinking_and_answer() -> None:
    assert _split([QWEN_REPLY], THINK) == Split("The user asks 2+2.\nThat is 4.", "It is **4**.", False)


@pytest.mark.parametrize("syntax,text", [(THINK, QWEN_REPLY), (HARMONY, HARMONY_REPLY)])
def test_split_does_not_depend_on_how_the_text_arrives(syntax: str, text: str) -> None:
    whole = _split([text], syntax)
    assert whole.thinking and whole.answer
    for pieces in _chunkings(text, 200):
        assert _split(pieces, syntax) == whole, pieces


def test_a_marker_split_across_pieces_is_held_back_until_whole() -> None:
    splitter = ReasoningSplitter(THINK)
    splitter.feed("Hmm <thi")
    assert splitter.split() == Split("", "Hmm ", False)  # "<thi" may become <think>
    splitter.feed("nk>idea")
    assert splitter.split() == Split("idea", "Hmm ", True)
    splitter.feed("</thi")
    assert splitter.split().thinking == "idea"
    splitter.feed("s is not a marker")
    assert splitter.split() == Split("idea</this is not a marker", "Hmm ", True)


def test_a_reply_that_never_closes_its_thinking_is_all_thinking() -> None:
    assert _split(["<think>\nStill going", " and going <"], THINK) == Split("Still going and going <", "", True)


def test_a_prompt_that_opened_the_thinking_starts_the_reply_inside_it() -> None:
    reply = "The user asks.\n</think>\n\nAnswer."
    assert _split([reply], THINK, starts_in_thinking=True) == Split("The user asks.", "Answer.", False)
    splitter = ReasoningSplitter(THINK, starts_in_thinking=True)
    splitter.feed("The user")
    assert splitter.split() == Split("The user", "", True)


def test_a_close_without_an_open_turns_the_text_before_it_into_thinking() -> None:
    # the template opened <think> in the prompt but the app did not know: the reply is corrected when it closes
    splitter = ReasoningSplitter(THINK)
    splitter.feed("The user asks.\n")
    assert splitter.split() == Split("", "The user asks.\n", False)
    splitter.feed("</think>\n\nAnswer.")
    assert splitter.split() == Split("The user asks.", "Answer.", False)


def test_text_without_markers_and_models_without_reasoning_are_all_answer() -> None:
    assert _split(["a < b and c > d"], THINK) == Split("", "a < b and c > d", False)
    assert _split(["<think>not parsed</think> here"], None) == Split("", "<think>not parsed</think> here", False)


def test_two_thoughts_are_kept_apart() -> None:
    split = _split(["<think>one</think>middle<think>two</think>end"], THINK)
    assert split == Split("one\n\ntwo", "middleend", False)


def test_harmony_analysis_is_thinking_and_final_is_answer() -> None:
    assert _split([HARMONY_REPLY], HARMONY) == Split("User asks 2+2. Simple.", "It is 4.", False)
    tool_call = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}"
    assert _split([tool_call], HARMONY) == Split("", "{}", False)


def test_unknown_syntax_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown reasoning syntax 'xml'"):
        ReasoningSplitter("xml")


# -- token counts ------------------------------------------------------------------------------------------
def test_thinking_tokens_count_the_markers_with_the_thinking() -> None:
    pieces = ["<think>", "\n", "Let", " me", " see", "\n", "</think>", "\n\n", "Yes", "."]
    assert count_thinking_tokens(pieces, THINK) == 7
    assert count_thinking_tokens(pieces[1:], THINK, starts_in_thinking=True) == 6
    assert count_thinking_tokens(pieces[1:], THINK) == 6  # the close without an open counts what came before
    assert count_thinking_tokens(["Just", " an", " answer"], THINK) == 0
    assert count_thinking_tokens(["<think>", "never", " closed"], THINK) == 3


def test_thinking_tokens_of_a_marker_split_across_tokens() -> None:
    assert count_thinking_tokens(["<th", "ink", ">\n", "hi", "</", "think", ">\n\n", "Yes"], THINK) == 7
    assert count_thinking_tokens(["a", " <", "b"], THINK) == 0


def test_harmony_headers_count_with_their_message() -> None:
    pieces = ["<|channel|>", "analysis", "<|message|>", "User", " asks", "<|end|>",
              "<|start|>", "assistant", "<|channel|>", "final", "<|message|>", "Hi"]
    assert count_thinking_tokens(pieces, HARMONY) == 6


def test_thinking_stats_read_each_generated_token_s_own_text() -> None:
    tok = Tokenizer.from_gguf(read_gguf(vocab_file("qwen2")))  # <think> is several tokens in this vocabulary
    prompt = tok.encode("<|im_start|>assistant\n", add_special=False, parse_special=True)
    reply = tok.encode("<think>\nhi there\n</think>\n\nAnswer", add_special=False)
    assert thinking_stats(tok, ReasoningProfile(THINK), prompt + reply, len(reply)) == {
        "thinking_tokens": len(reply) - 1}
    opened = tok.encode("<|im_start|>assistant\n<think>\n", add_special=False, parse_special=True)
    rest = tok.encode("hi there\n</think>\n\nAnswer", add_special=False)
    assert thinking_stats(tok, ReasoningProfile(THINK), opened + rest, len(rest)) == {"thinking_tokens": len(rest) - 1}
    assert thinking_stats(tok, ReasoningProfile(None), prompt + reply, len(reply)) == {}
    assert thinking_stats(tok, ReasoningProfile(THINK), prompt, 0) == {}


# -- templates -----------------------------------------------------------------------------------------------
def test_prompt_opens_thinking() -> None:
    assert prompt_opens_thinking("<|im_start|>assistant\n<think>\n", THINK)
    assert not prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n", THINK)
    assert not prompt_opens_thinking("<|im_start|>assistant\n<think>\n", None)


@pytest.mark.parametrize("name,profile", [
    ("Qwen-Qwen3-0.6B", ReasoningProfile(THINK, True, False, False)),
    ("Qwen3.5-4B", ReasoningProfile(THINK, True, True, False)),
    ("HuggingFaceTB-SmolLM3-3B", ReasoningProfile(THINK, True, False, False)),
    ("Qwen-QwQ-32B", ReasoningProfile(THINK, True, True, False)),
    ("openai-gpt-oss-120b", ReasoningProfile(HARMONY, False, False, False)),
    ("meta-llama-Llama-3.2-3B-Instruct", ReasoningProfile(None, False, False, False)),
    ("google-gemma-2-2b-it", ReasoningProfile(None, False, False, False)),
])
def test_real_templates_reasoning_profiles(name: str, profile: ReasoningProfile) -> None:
    template = ChatTemplate(chat_template(name))
    assert template.reasoning == profile
    assert detect_syntax(template.source) == profile.syntax
    assert template.reasoning.template_vars(False) == ({"enable_thinking": False} if profile.has_switch else {})


def test_a_template_that_fails_to_render_does_not_open_the_thinking() -> None:
    def failing(**extra):
        raise ValueError("System role not supported")

    assert profile_of("{{ raise_exception('x') }} </think>", failing) == ReasoningProfile(THINK, False, False, False)
    assert profile_of("<think>{% if enable_thinking %}", lambda **extra: "<think>\n" if extra["enable_thinking"]
                      else "") == ReasoningProfile(None, True)  # no </think>: no syntax to split on


def test_profile_round_trips_and_malformed_data_means_no_reasoning() -> None:
    profile = ReasoningProfile(THINK, True, True, False)
    assert ReasoningProfile.from_dict(profile.to_dict()) == profile
    assert ReasoningProfile.from_dict({"syntax": "xml"}) == ReasoningProfile()
    assert ReasoningProfile.from_dict(None) == ReasoningProfile()
    assert profile.opens(True) and profile.opens(None) and not profile.opens(False)


# -- through the model --------------------------------------------------------------------------------------
def test_model_passes_enable_thinking_to_its_template_and_counts_thinking(tmp_path) -> None:
    from engine.model import load
    from tests.engine.gguf_builders import write_tiny_llama

    path = write_tiny_llama(tmp_path / "qwen3-template.gguf",
                            metadata={"tokenizer.chat_template": chat_template("Qwen-Qwen3-0.6B")})
    model = load(path, backend="numpy", n_ctx=256)
    try:
        assert model.reasoning == ReasoningProfile(THINK, True, False, False)
        messages = [{"role": "user", "content": "Hi"}]
        off = model.detokenize(model.chat_ids(messages, template_vars={"enable_thinking": False}))
        on = model.detokenize(model.chat_ids(messages, template_vars={"enable_thinking": True}))
        assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") and on.endswith("assistant\n")
        prompt = model.chat_ids(messages)
        reply = model.tokenize("<think>\nhm\n</think>\n\nYes", add_special=False)
        closed = next(k for k in range(len(reply) + 1) if "</think>" in model.detokenize(reply[:k]))
        assert 10 < closed < len(reply)  # tiny vocabulary: the markers are several tokens
        assert model.thinking_stats(len(reply), prompt + reply) == {"thinking_tokens": closed}
        _, events = model.chat(messages, max_tokens=4, template_vars={"enable_thinking": False})
        last = list(events)[-1]
        assert set(model.thinking_stats(last.generated_tokens)) == {"thinking_tokens"}  # the live sequence
    finally:
        model.close()


# -- Mistral's [THINK] ------------------------------------------------------------------------------------------
def test_mistral_think_markers_split_like_think_tags() -> None:
    reply = "[THINK]Check the units.[/THINK]It is 5 m."
    assert _split([reply], MISTRAL) == Split("Check the units.", "It is 5 m.", False)
    for pieces in _chunkings(reply, 50):
        assert _split(pieces, MISTRAL) == _split([reply], MISTRAL)
    assert count_thinking_tokens(["[THINK]", "Check", "[/THINK]", "It"], MISTRAL) == 3


def test_ministral_reasoning_template_profile() -> None:
    template = ChatTemplate(chat_template("mistralai-Ministral-3-14B-Reasoning-2512"))
    assert template.reasoning == ReasoningProfile(MISTRAL, False, False, False)


def _mistral_vocab(template: str | None) -> Tokenizer:
    """A small SentencePiece vocabulary with Mistral's [THINK] control tokens and a given chat template."""
    tokens = ["<unk>", "<s>", "</s>", "[THINK]", "[/THINK]", "\u2581Hi", *(f"<0x{b:02X}>" for b in range(256))]
    metadata = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
                "tokenizer.ggml.token_type": np.array([2, 3, 3, 3, 3, 1] + [6] * 256, "int32")}
    if template is not None:
        metadata["tokenizer.chat_template"] = template
    return Tokenizer(load_vocab(metadata))


def test_the_markers_a_template_uses_survive_skip_special() -> None:
    tok = _mistral_vocab("{{ '[THINK]' + thinking + '[/THINK]' }}")
    ids = [3, 5, 4, 5]
    assert tok.decode(ids, skip_special=True) == "[THINK] Hi[/THINK] Hi"
    assert tok.decode([1, *ids, 2], skip_special=True) == "[THINK] Hi[/THINK] Hi"  # BOS and EOS still left out
    plain = _mistral_vocab("{{ messages }}")  # a template without them: they stay control tokens, left out
    assert plain.decode(ids, skip_special=True) == " Hi Hi"
    assert _mistral_vocab(None).decode(ids, skip_special=True) == " Hi Hi"
    assert tok.encode("[THINK]", add_special=False) != [3]  # still matched only with parse_special, as in llama.cpp
