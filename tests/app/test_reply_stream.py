"""The reply loop on the scheduler's fake backend: every reply, alone or beside others, through one scheduler;
text and stats per reply, priorities that follow the screen, Stop, a failing request, the policy's rests and
what the dashboard is told. (Real replies: test_worker_batched.py.)"""

import dataclasses
import threading

import pytest

from app.reply_stream import Hooks, Reply, ReplyLoop
from engine.scheduler import Request, Scheduler
from engine.thermal import Limits
from tests.engine.test_scheduler import FakeBackend, greedy, solo

from .fake_engine import FixedMonitor


class Decoder:
    """Each token is its id and a space."""

    def add(self, token: int) -> str:
        return f"{token} "

    def flush(self) -> str:
        return ""


@dataclasses.dataclass
class Seen:
    text: dict = dataclasses.field(default_factory=dict)
    finished: dict = dataclasses.field(default_factory=dict)
    order: list = dataclasses.field(default_factory=list)
    failed: dict = dataclasses.field(default_factory=dict)
    samples: list = dataclasses.field(default_factory=list)
    events: list = dataclasses.field(default_factory=list)
    naps: list = dataclasses.field(default_factory=list)


def loop_for(limits=Limits(prefill_chunk=64, max_batch=8, pause_s=0.0), shown=lambda: None):
    seen = Seen()

    def finished(reply, reason):
        seen.finished[reply.request_id] = reply.stats(reason, 256, "fake").as_dict()
        seen.order.append(reply.request_id)

    hooks = Hooks(tokens=lambda rid, text: seen.text.update({rid: seen.text.get(rid, "") + text}),
                  finished=finished, failed=lambda rid, error: seen.failed.update({rid: str(error)}),
                  shown=shown, admit=lambda loop: None,
                  event=lambda reply, event: seen.events.append((reply.request_id, event.index)),
                  sample=lambda rid, rate, batch: seen.samples.append((rid, batch)))
    scheduler = Scheduler(FakeBackend(), 256, monitor=FixedMonitor(limits))
    return ReplyLoop(scheduler, hooks, sleep=seen.naps.append), seen


def add(loop, request_id, conversation, prompt, max_tokens=6) -> Reply:
    cancel = threading.Event()
    handle = loop.scheduler.submit(Request(tuple(prompt), greedy, max_tokens, decoder=Decoder(), cancel=cancel))
    reply = Reply(request_id, conversation, handle, cancel)
    loop.add(reply)
    return reply


def test_each_reply_gets_its_own_text_and_stats():
    loop, seen = loop_for()
    add(loop, 1, 10, [1, 2, 3])
    add(loop, 2, 20, [5] * 9, max_tokens=4)
    loop.run()
    assert seen.text == {1: "".join(f"{t} " for t in solo([1, 2, 3], 6)), 2: "".join(f"{t} " for t in solo([5] * 9, 4))}
    assert seen.finished[1]["finish_reason"] == "length" and seen.finished[1]["generated_tokens"] == 6
    assert seen.finished[2]["prompt_tokens"] == 9 and seen.finished[2]["batched"]
    assert ("decode", 2) in loop.scheduler.backend.calls  # one pass for both
    assert (0, 2) in [(rid, batch) for rid, batch in seen.samples]  # the dashboard heard of the batch of two


def test_a_lone_reply_is_a_batch_of_one_in_the_same_loop():
    loop, seen = loop_for()
    add(loop, 1, 10, [1, 2, 3])
    loop.run()
    assert seen.text[1] == "".join(f"{t} " for t in solo([1, 2, 3], 6))
    assert "batched" not in seen.finished[1] and seen.finished[1]["generated_tokens"] == 6
    assert seen.events == [(1, i) for i in range(6)]  # every token of a lone reply reaches the dashboard's probe
    assert not any(batch > 1 for _, batch in loop.scheduler.backend.calls if _ == "decode")


def test_a_reply_arriving_mid_stream_joins_at_the_next_step_without_a_hand_over():
    loop, seen = loop_for()
    first = add(loop, 1, 10, [1, 2, 3], max_tokens=12)
    joined = []

    def admit(_loop):  # the second request arrives once the first has streamed three tokens
        if not joined and first.last is not None and first.last.index == 2:
            joined.append(add(_loop, 2, 20, [4, 5], max_tokens=5))

    loop.hooks.admit = admit
    loop.run()
    assert seen.text[1] == "".join(f"{t} " for t in solo([1, 2, 3], 12))  # as it would alone, never restarted
    assert seen.text[2] == "".join(f"{t} " for t in solo([4, 5], 5))
    assert seen.finished[1]["prompt_tokens"] == 3 and seen.finished[1]["generated_tokens"] == 12
    assert seen.finished[1]["batched"] and seen.finished[2]["batched"]


def test_the_conversation_on_screen_goes_first_and_switching_moves_it_ahead():
    shown = [20]
    loop, seen = loop_for(Limits(prefill_chunk=64, max_batch=1, pause_s=0.0), shown=lambda: shown[0])
    add(loop, 1, 10, [1, 2, 3], max_tokens=8)
    add(loop, 2, 20, [4, 5, 6], max_tokens=8)
    add(loop, 3, 30, [7, 8, 9], max_tokens=8)
    switched = []

    def admit(_loop):  # the user opens conversation 30 once conversation 20 has finished
        if 2 in seen.finished and not switched:
            shown[0] = 30
            switched.append(True)

    loop.hooks.admit = admit
    loop.run()
    assert seen.order == [2, 3, 1]
    assert all(seen.text[rid] for rid in (1, 2, 3))


def test_stop_cancels_one_reply_and_keeps_its_text():
    loop, seen = loop_for()
    one = add(loop, 1, 10, [1, 2, 3], max_tokens=50)
    add(loop, 2, 20, [4, 5, 6], max_tokens=5)

    def admit(_loop):
        if 2 in seen.finished:
            one.cancel.set()

    loop.hooks.admit = admit
    loop.run()
    assert seen.finished[1]["finish_reason"] == "cancelled" and 1 <= seen.finished[1]["generated_tokens"] < 50
    assert seen.text[1].split() == [str(t) for t in solo([1, 2, 3], seen.finished[1]["generated_tokens"])]
    assert seen.finished[2]["finish_reason"] == "length"


def test_a_bad_request_fails_alone():
    loop, seen = loop_for()
    add(loop, 1, 10, [1, 2, 3])
    add(loop, 2, 20, [1, 10_000])  # a token id the fake model does not have
    loop.run()
    assert "out of range" in seen.failed[2] and 2 not in seen.finished
    assert seen.finished[1]["finish_reason"] == "length"


def test_the_policy_rests_between_steps_in_slices_and_stop_cuts_it_short():
    loop, seen = loop_for(Limits(prefill_chunk=64, max_batch=8, pause_s=0.12))
    add(loop, 1, 10, [1, 2, 3], max_tokens=3)
    loop.run()
    assert seen.naps == pytest.approx([0.05, 0.05, 0.02] * 2)  # after the first two of its three steps
    loop, seen = loop_for(Limits(prefill_chunk=64, max_batch=8, pause_s=0.12))
    reply = add(loop, 1, 10, [1, 2, 3], max_tokens=30)

    def nap(seconds):  # Stop is pressed during the second slice of the first rest
        seen.naps.append(seconds)
        if len(seen.naps) == 2:
            reply.cancel.set()

    loop.sleep = nap
    loop.run()
    assert seen.naps == [0.05, 0.05] and seen.finished[1]["finish_reason"] == "cancelled"
