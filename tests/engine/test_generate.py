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


PROMPTS = ([5, 6, 7], [9, 10, 11, 12, 13], [30] * 9, [40, 41], [50, 60, 70, 80])


def run_together(model, prompts, params, n, stop_at=None):
    """Submit every prompt at once and step the model's scheduler to the end; the tokens of each, and the
    handle ids. ``stop_at=(i, k)`` sets request i's Stop flag after its k-th token."""
    flags = [threading.Event() for _ in prompts]
    handles = [model.submit(p, params, n, cancel=f) for p, f in zip(prompts, flags)]
    tokens = {h.id: [] for h in handles}
    finals = {}
    while model.scheduler.has_work:
        model.scheduler.step()
        for i, h in enumerate(handles):
            for e in h.ready():
                if isinstance(e, GenerationEvent):
                    tokens[h.id].append(e.id)
                    if stop_at is not None and stop_at[0] == i and len(tokens[h.id]) == stop_at[1]:
                        flags[i].set()
                    if e.finish_reason:
                        finals[h.id] = e.finish_reason
                else:
                    finals.setdefault(h.id, e.kind) if e.kind in ("cancelled", "failed") else None
    return [tokens[h.id] for h in handles], [finals.get(h.id) for h in handles]


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.0), SamplingParams(temperature=0.9, seed=8)])
def test_a_lone_reply_and_the_same_reply_beside_three_others_give_the_same_tokens(tiny_model_path, params):
    model = engine.model.load(tiny_model_path, backend="numpy", n_ctx=256)
    alone = [[e.id for e in model.generate_ids(p, params, 12)] for p in PROMPTS[:4]]
    fresh = engine.model.load(tiny_model_path, backend="numpy", n_ctx=256)
    together, finals = run_together(fresh, PROMPTS[:4], params, 12)
    assert together == alone and finals == ["length"] * 4
    assert all(len(t) == 12 for t in alone)


def test_stop_mid_reply_ends_that_reply_at_its_next_token_and_the_others_go_on(tiny_model_path):
    model = engine.model.load(tiny_model_path, backend="numpy", n_ctx=256)
    greedy = SamplingParams(temperature=0.0)
    alone = [[e.id for e in model.generate_ids(p, greedy, 20)] for p in PROMPTS[:3]]
    together, finals = run_together(model, PROMPTS[:3], greedy, 20, stop_at=(1, 4))
    assert finals == ["length", "cancelled", "length"]
    assert together[1] == alone[1][:5]  # stopped after its 4th token: the 5th token's event says so
    assert together[0] == alone[0] and together[2] == alone[2]


def test_a_second_reply_arriving_mid_stream_joins_without_any_hand_over(tiny_model_path):
    """The first reply keeps the resident cache from start to finish (the same cache object, never handed over);
    the second, arriving after four tokens, runs beside it on a cache of its own; both say what they would alone,
    and a follow-up of the first reuses its prefix."""
    greedy = SamplingParams(temperature=0.0)
    reference = engine.model.load(tiny_model_path, backend="numpy", n_ctx=256)
    alone = [[e.id for e in reference.generate_ids(p, greedy, 16)] for p in PROMPTS[:2]]
    model = engine.model.load(tiny_model_path, backend="numpy", n_ctx=256)
    first = model.submit(PROMPTS[0], greedy, 16)
    resident = model._cache
    got, second, batches = {first.id: []}, None, []
    while model.scheduler.has_work:
        report = model.scheduler.step()
        batches.append(report.decode_batch)
        for handle in filter(None, (first, second)):
            got[handle.id] += [e.id for e in handle.ready() if isinstance(e, GenerationEvent)]
        if second is None and len(got[first.id]) == 4:
            second = model.submit(PROMPTS[1], greedy, 16)
            got[second.id] = []
            assert model._cache is resident  # the first reply's cache stays where it is
    assert got[first.id] == alone[0] and got[second.id] == alone[1]
    assert 2 in batches  # they decoded together
    assert model._cache is resident and model.sequence == PROMPTS[0] + alone[0]
    follow_up = model.sequence + [20, 21]
    events = list(model.generate_ids(follow_up, greedy, 4))
    assert events[0].cached_tokens == len(PROMPTS[0]) + 15
    assert [e.id for e in events] == [e.id for e in reference.generate_ids(follow_up, greedy, 4)]


def test_closing_a_stream_early_leaves_the_resident_cache_consistent(tiny, tiny_model_path):
    params = SamplingParams(temperature=0.0)
    stream = tiny.generate_ids([5, 6, 7], params, 12)
    first = [next(stream).id for _ in range(4)]
    stream.close()
    assert tiny.sequence == [5, 6, 7, *first] and tiny.kv_cache_usage.used_positions == 6
    assert not tiny.scheduler.has_work
    follow_up = [5, 6, 7, *first, 9]
    fresh = engine.model.load(tiny_model_path, backend="numpy", n_ctx=1024)
    np.testing.assert_allclose(tiny.next_token_logits(follow_up), fresh.next_token_logits(follow_up), rtol=1e-4, atol=1e-6)


def test_mlx_pipelined_steps_of_a_lone_reply_give_way_to_a_batch_when_a_second_arrives(tiny_model_path):
    """MLX declares pipelined greedy decoding: a lone greedy reply takes it; when a second reply arrives the
    device steps queued ahead are rolled back and both decode in one batch, each with the tokens it gets alone."""
    greedy = SamplingParams(temperature=0.0, repeat_penalty=1.0)  # an argmax the device can take
    reference = engine.model.load(tiny_model_path, backend="numpy", n_ctx=256)
    alone = [[e.id for e in reference.generate_ids(p, greedy, 14)] for p in PROMPTS[:2]]
    model = engine.model.load(tiny_model_path, backend="mlx", n_ctx=256)
    assert model.backend.pipelined_greedy and not reference.backend.pipelined_greedy
    pipelines = []
    start_pipeline = model.backend.decode_greedy_pipelined
    model.backend.decode_greedy_pipelined = lambda *args: pipelines.append(args) or start_pipeline(*args)
    assert [e.id for e in model.generate_ids(PROMPTS[0], greedy, 14)] == alone[0]
    assert len(pipelines) == 1
    first = model.submit(PROMPTS[0], greedy, 14)
    got, second, batches = {first.id: []}, None, []
    while model.scheduler.has_work:
        batches.append(model.scheduler.step().decode_batch)
        for handle in filter(None, (first, second)):
            got[handle.id] += [e.id for e in handle.ready() if isinstance(e, GenerationEvent)]
        if second is None and len(got[first.id]) == 5:
            second = model.submit(PROMPTS[1], greedy, 14)
            got[second.id] = []
    assert got[first.id] == alone[0] and got[second.id] == alone[1]
    assert 2 in batches and len(pipelines) >= 2
    assert model.sequence == PROMPTS[0] + alone[0]
    model.close()


def test_a_refusal_names_the_context_length_and_the_room_kept_for_the_reply(tiny_model_path):
    model = engine.model.load(tiny_model_path, backend="numpy", n_ctx=256)
    too_long = [{"role": "user", "content": "word " * 400}]
    with pytest.raises(ContextOverflowError, match=r"the context of 256 tokens, which keeps 64 for the reply$"):
        model.fit_chat(too_long, max_tokens=64)
    with pytest.raises(ContextOverflowError, match=r"the context of 256 tokens, which keeps 64 for the reply$"):
        model.fit_chat(too_long * 3, max_tokens=1000, overflow="stop")  # the reply keeps at most a quarter
