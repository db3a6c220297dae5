"""Replies running together on the real built-in model: a request for the same model that arrives while a reply
streams joins it in the model's scheduler (the running reply goes on as it was, no hand-over), each reply's text is
what it would be alone, the conversation on screen decodes first when the thermal policy allows one sequence at a time, and Stop
ends only the reply it names."""

import pytest

import threading

from app.reply_stream import Hooks, Reply, ReplyLoop
from app.engine_host import EngineHost
from app.worker import load_engine_model, make_sampling_params
from engine.model import load
from engine.sampling import SamplingParams
from engine.thermal import Limits, ThermalMonitor, default_provider
from tests.model_store import model_path

from .fake_engine import FixedMonitor, make_cool

pytestmark = pytest.mark.slow

N_CTX = 1024
TEA = [{"role": "user", "content": "Tell me everything about the history of tea."}]
SEA = [{"role": "user", "content": "Write a poem about the sea."}]
SAMPLED = {"temperature": 0.8, "seed": 11, "max_tokens": 160}  # seeded: the same text every run


@pytest.fixture
def host(qtbot):
    # a cool machine: on a hot or shared one the policy may rightly allow one sequence at a time (tested below)
    host = EngineHost(load_engine_model, make_sampling_params, thermal=make_cool(ThermalMonitor(default_provider())))
    yield host
    host.shutdown()


def answer(qtbot, host, messages, options, conversation_id) -> tuple[int, str, dict]:
    text, done = [], {}
    host.tokens.connect(lambda rid, t: text.append((rid, t)))
    host.finished.connect(lambda rid, stats: done.update({rid: stats}))
    rid = host.generate(str(model_path("smollm2")), N_CTX, messages, {**options, "conversation_id": conversation_id})
    qtbot.waitUntil(lambda: rid in done, timeout=120000)
    return rid, "".join(t for r, t in text if r == rid), done[rid]


def test_a_second_request_joins_the_streaming_reply_and_both_say_what_they_would_alone(qtbot, host):
    path = str(model_path("smollm2"))
    _, tea_alone, stats = answer(qtbot, host, TEA, SAMPLED, 1)
    assert "batched" not in stats and stats["generated_tokens"] > 40
    _, sea_alone, _ = answer(qtbot, host, SEA, SAMPLED, 2)

    text, done = {}, {}
    host.tokens.connect(lambda rid, t: text.update({rid: text.get(rid, "") + t}))
    host.finished.connect(lambda rid, stats: done.update({rid: stats}))
    host.activate(1)
    with qtbot.waitSignal(host.tokens, timeout=120000):  # the first reply streams...
        tea = host.generate(path, N_CTX, TEA, {**SAMPLED, "conversation_id": 1})
    sea = host.generate(path, N_CTX, SEA, {**SAMPLED, "conversation_id": 2})  # ...when the second arrives
    qtbot.waitUntil(lambda: {tea, sea} <= set(done), timeout=120000)
    assert done[tea]["batched"] and done[sea]["batched"]
    assert text[tea] == tea_alone and text[sea] == sea_alone
    assert done[tea]["generated_tokens"] == stats["generated_tokens"]
    follow_up = [*TEA, {"role": "assistant", "content": text[tea]}, {"role": "user", "content": "And coffee?"}]
    _, _, more = answer(qtbot, host, follow_up, {**SAMPLED, "max_tokens": 4}, 1)
    assert more["cached_tokens"] > stats["prompt_tokens"]  # the first reply's cache was kept for reuse


def test_stop_ends_only_the_reply_it_names(qtbot, host):
    path = str(model_path("smollm2"))
    long = {**SAMPLED, "max_tokens": 2000}
    done = {}
    host.finished.connect(lambda rid, stats: done.update({rid: stats}))
    with qtbot.waitSignal(host.tokens, timeout=120000):
        first = host.generate(path, N_CTX, TEA, {**long, "conversation_id": 1})
    with qtbot.waitSignal(host.tokens, timeout=120000, check_params_cb=lambda rid, text: rid == second):
        second = host.generate(path, N_CTX, SEA, {**long, "conversation_id": 2})
    with qtbot.waitSignal(host.finished, timeout=120000, check_params_cb=lambda rid, stats: rid == second):
        host.stop(second)
    assert done[second]["finish_reason"] == "cancelled" and first not in done
    with qtbot.waitSignal(host.finished, timeout=120000, check_params_cb=lambda rid, stats: rid == first):
        host.stop(first)
    assert done[first]["finish_reason"] == "cancelled" and done[first]["batched"]


def test_the_conversation_on_screen_decodes_first_when_one_sequence_is_allowed():
    model = load(model_path("smollm2"), "cpu", N_CTX)
    model.set_monitor(FixedMonitor(Limits(prefill_chunk=64, max_batch=1, pause_s=0.0)))
    order, tokens = [], {}
    shown = [2]
    hooks = Hooks(tokens=lambda rid, text: tokens.setdefault(rid, []).append(text),
                  finished=lambda reply, reason: order.append(reply.request_id),
                  failed=lambda rid, error: order.append(("failed", rid)), shown=lambda: shown[0],
                  admit=lambda loop: None, event=lambda reply, event: None, sample=lambda rid, rate, batch: None)
    loop = ReplyLoop(model.scheduler, hooks)
    params = SamplingParams(temperature=0.0)
    for request_id, conversation, messages in ((10, 1, TEA), (20, 2, SEA)):
        cancel = threading.Event()
        dropped, handle = model.start_chat(messages, params, 24, priority=int(conversation == shown[0]), cancel=cancel)
        loop.add(Reply(request_id, conversation, handle, cancel, dropped))
    loop.run()
    assert order == [20, 10]  # conversation 2 is on screen: it ran first although it arrived second
