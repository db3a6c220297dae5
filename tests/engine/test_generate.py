"""Generation loop, stop strings, cancellation, prefix reuse, KV cache growth/rollback and the overflow policy."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import engine.model
from engine.context import ContextOverflowError, fit_messages
from engine.generate import GenerationEvent, StopMatcher
from engine.kv_cache import GROWTH_STEP
from engine.sampling import SamplingParams


@pytest.fixture(scope="module")
def tiny(tiny_model_path):
    model = engine.model.load(tiny_model_path, backend="numpy", n_ctx=1024)
    yield model
    model.close()


def greedy_ids(model, ids, n):
    return [ev.id for ev in model.generate_ids(list(ids), SamplingParams(temperature=0.0), n)]


def test_stop_matcher_holds_back_a_possible_stop_prefix():
    m = StopMatcher(["</end>"])
    assert m.feed("Hello </") == ("Hello ", False)
    assert m.feed("e") == ("", False)
    assert m.feed("x") == ("</ex", False)
    assert m.feed(" done </en") == (" done ", False)
    assert m.feed("d> tail") == ("", True)


def test_stop_matcher_without_stop_strings_emits_everything():
    m = StopMatcher([])
    assert m.feed("abc") == ("abc", False)
    assert m.flush() == ""


def test_generation_stops_at_max_tokens_with_reason(tiny):
    events = list(tiny.generate_ids([5, 6, 7], SamplingParams(temperature=0.0), 5))
    assert [e.index for e in events] == [0, 1, 2, 3, 4]
    assert events[-1].finish_reason == "length"
    assert all(e.finish_reason is None for e in events[:-1])
    assert events[-1].prompt_tokens == 3


def test_stop_string_ends_generation_and_is_not_shown(tiny):
    ids = greedy_ids(tiny, [5, 6, 7], 12)
    text = tiny.detokenize(ids)
    stop = text[len(text) // 2:len(text) // 2 + 2]
    assert stop.strip(), "the tiny model produced whitespace only; pick other prompt ids"
    events = list(tiny.generate_ids([5, 6, 7], SamplingParams(temperature=0.0), 12, stop=[stop]))
    shown = "".join(e.text for e in events)
    assert events[-1].finish_reason == "stop"
    assert stop not in shown
    assert text.startswith(shown)


def test_eog_token_ends_generation(tiny):
    eog = min(tiny.tokenizer.eog_ids)
    first = greedy_ids(tiny, [5, 6, 7], 1)[0]
    tiny.tokenizer.eog_ids = frozenset({first})  # make the first greedy token an end-of-generation token
    try:
        events = list(tiny.generate_ids([5, 6, 7], SamplingParams(temperature=0.0), 10))
    finally:
        tiny.tokenizer.eog_ids = frozenset({eog})
    assert len(events) == 1 and events[0].finish_reason == "eos" and events[0].text == ""


def test_cancel_from_another_thread_stops_at_the_next_token(tiny):
    events = []
    for ev in tiny.generate_ids([5, 6, 7], SamplingParams(temperature=0.0), 200):
        events.append(ev)
        if ev.index == 3:
            threading.Thread(target=tiny.cancel).start()
            threading.Event().wait(0.05)
    assert events[-1].finish_reason == "cancelled"
    assert len(events) < 200


def test_follow_up_prompt_reuses_the_cached_prefix_with_identical_logits(tiny):
    prompt = [5, 6, 7, 8, 9, 10, 11, 12]
    first = list(tiny.generate_ids(prompt, SamplingParams(temperature=0.0), 4))
    follow_up = prompt + [e.id for e in first] + [20, 21, 22]
    events = list(tiny.generate_ids(follow_up, SamplingParams(temperature=0.0), 4))
    assert events[0].cached_tokens == len(prompt) + 3  # the 4th generated token was never fed back
    fresh = engine.model.load(tiny.path, backend="numpy", n_ctx=1024)
    assert [e.id for e in events] == greedy_ids(fresh, follow_up, 4)


def test_next_token_logits_is_independent_of_what_was_cached(tiny):
    a = tiny.next_token_logits([1, 2, 3, 4, 5])
    tiny.next_token_logits([9, 9, 9])
    b = tiny.next_token_logits([1, 2, 3, 4, 5])
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_kv_cache_grows_in_steps_and_rolls_back(tiny):
    backend = tiny.backend
    cache = backend.new_cache(1024)
    assert cache.nbytes > 0 and cache.capacity == GROWTH_STEP
    ids = [3 + i % 200 for i in range(GROWTH_STEP + 10)]
    logits_full = backend.forward(ids, cache, all_logits=True)
    assert cache.capacity == 2 * GROWTH_STEP and cache.n_past == len(ids)
    cache.truncate(100)
    again = backend.forward(ids[100:], cache, all_logits=True)
    np.testing.assert_allclose(again, logits_full[100:], rtol=1e-4, atol=1e-4)


def test_kv_state_round_trip(tiny):
    backend = tiny.backend
    cache = backend.new_cache(64)
    backend.forward([3, 4, 5, 6], cache)
    other = backend.new_cache(64)
    other.import_state(cache.export_state())
    np.testing.assert_array_equal(backend.forward([7], cache), backend.forward([7], other))


def test_context_full_is_a_clear_error(tiny):
    cache = tiny.backend.new_cache(8)
    tiny.backend.forward(list(range(3, 11)), cache)
    with pytest.raises(ValueError, match="context is full"):
        tiny.backend.forward([3], cache)


def test_generation_reports_context_when_the_cache_fills(tiny_model_path):
    model = engine.model.load(tiny_model_path, backend="numpy", n_ctx=12)
    events = list(model.generate_ids([5, 6, 7, 8, 9, 10, 11, 12, 13, 14], SamplingParams(temperature=0.0), 50))
    assert events[-1].finish_reason == "context"
    assert len(events) == 3  # 10 prompt + 2 fed back fill 12 positions; the 3rd token is sampled from the last logits


def test_fit_messages_keeps_system_and_drops_oldest_exchanges():
    messages = [{"role": "system", "content": "s"}] + [
        {"role": r, "content": f"{r}{i}"} for i in range(4) for r in ("user", "assistant")] + [{"role": "user", "content": "last"}]
    kept, dropped = fit_messages(messages, lambda m: 10 * len(m), budget=50)
    assert kept[0]["role"] == "system" and kept[-1]["content"] == "last"
    assert kept[1]["role"] == "user" and dropped == 6 and len(kept) == 4


def test_fit_messages_stop_policy_refuses():
    messages = [{"role": "user", "content": "x"}] * 3
    with pytest.raises(ContextOverflowError):
        fit_messages(messages, lambda m: 10 * len(m), budget=20, policy="stop")


def test_fit_messages_refuses_when_the_last_message_alone_is_too_long():
    with pytest.raises(ContextOverflowError, match="last message"):
        fit_messages([{"role": "user", "content": "x"}], lambda m: 100, budget=20)


def test_chat_drops_old_turns_to_fit(tiny_model_path):
    model = engine.model.load(tiny_model_path, backend="numpy", n_ctx=128)
    long = "word " * 30
    messages = [{"role": "system", "content": "be brief"}]
    for _ in range(6):
        messages += [{"role": "user", "content": long}, {"role": "assistant", "content": long}]
    messages.append({"role": "user", "content": "and now?"})
    dropped, events = model.chat(messages, SamplingParams(temperature=0.0), max_tokens=8)
    assert dropped > 0
    assert len(list(events)) > 0


def test_a_stream_handed_over_to_the_scheduler_goes_on_as_it_would_have(tiny, tiny_model_path):
    from engine.scheduler import Scheduler

    params = SamplingParams(temperature=0.9, seed=5)
    alone = [e.id for e in tiny.generate_ids([5, 6, 7], params, 12)]
    stream = tiny.generate_ids([5, 6, 7], params, 12)
    first = [next(stream).id for _ in range(4)]
    stream.close()
    request = tiny.continuation(8)
    assert request.prompt_ids == (5, 6, 7, *first) and request.cache.n_past == 6  # all but the last sampled token
    scheduler = Scheduler(tiny.backend, tiny.n_ctx)
    handle = scheduler.submit(request)
    while scheduler.has_work:
        scheduler.step()
    rest = [e.id for e in handle.stream(0) if isinstance(e, GenerationEvent)]
    assert first + rest == alone
    tiny.settle([5, 6, 7, *first, *rest])
    assert tiny.sequence == [5, 6, 7, *alone]
    follow_up = [5, 6, 7, *alone, 9]
    fresh = engine.model.load(tiny_model_path, backend="numpy", n_ctx=1024)
    np.testing.assert_allclose(tiny.next_token_logits(follow_up), fresh.next_token_logits(follow_up), rtol=1e-4, atol=1e-6)


def test_nothing_to_continue_is_a_clear_error(tiny):
    tiny.next_token_logits([5, 6, 7])
    with pytest.raises(ValueError, match="no reply to continue"):
        tiny.continuation(4)
    list(tiny.generate_ids([5, 6, 7], SamplingParams(temperature=0.0), 3, stop=["zz"]))
    with pytest.raises(ValueError, match="stop strings"):
        tiny.continuation(4)


def test_a_refusal_names_the_context_length_and_the_room_kept_for_the_reply(tiny_model_path):
    model = engine.model.load(tiny_model_path, backend="numpy", n_ctx=256)
    too_long = [{"role": "user", "content": "word " * 400}]
    with pytest.raises(ContextOverflowError, match=r"the context of 256 tokens, which keeps 64 for the reply$"):
        model.fit_chat(too_long, max_tokens=64)
    with pytest.raises(ContextOverflowError, match=r"the context of 256 tokens, which keeps 64 for the reply$"):
        model.fit_chat(too_long * 3, max_tokens=1000, overflow="stop")  # the reply keeps at most a quarter
