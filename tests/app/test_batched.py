"""The batch runner on the scheduler's fake backend: text and stats per reply, priorities that follow the screen,
Stop, a failing request, the policy's rests and what the dashboard is told. (Real replies: test_worker_batched.py.)"""

import dataclasses

import pytest

from app.batched import BatchedReply, BatchRunner, Hooks
from engine.scheduler import Request
from engine.thermal import Limits
from tests.engine.test_scheduler import FakeBackend, greedy, solo

from .fake_engine import FixedMonitor


class FakeModel:
    name, n_ctx = "fake", 256

    def __init__(self):
        self.backend = FakeBackend()

    def thinking_stats(self, n_generated, sequence=None):
        return {}


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
    naps: list = dataclasses.field(default_factory=list)


def runner_for(limits=Limits(prefill_chunk=64, max_batch=8, pause_s=0.0), shown=lambda: None,
               stopped=lambda rid: False, steps=None):
    seen = Seen()

    def admit(runner):
        if steps is not None:
            steps.append(runner)

    def finished(rid, stats):
        seen.finished[rid] = stats
        seen.order.append(rid)

    hooks = Hooks(tokens=lambda rid, text: seen.text.update({rid: seen.text.get(rid, "") + text}),
                  finished=finished, failed=lambda rid, message: seen.failed.update({rid: message}),
                  stopped=stopped, shown=shown, admit=admit,
                  sample=lambda rid, rate, batch: seen.samples.append((rid, batch)))
    runner = BatchRunner(FakeModel(), FixedMonitor(limits), hooks, sleep=seen.naps.append)
    return runner, seen


def reply(request_id, conversation, prompt, max_tokens=6):
    return BatchedReply(request_id, conversation, Request(tuple(prompt), greedy, max_tokens, decoder=Decoder()))


def test_each_reply_gets_its_own_text_and_stats():
    runner, seen = runner_for()
    runner.add(reply(1, 10, [1, 2, 3]))
    runner.add(reply(2, 20, [5] * 9, max_tokens=4))
    runner.run()
    assert seen.text == {1: "".join(f"{t} " for t in solo([1, 2, 3], 6)), 2: "".join(f"{t} " for t in solo([5] * 9, 4))}
    assert seen.finished[1]["finish_reason"] == "length" and seen.finished[1]["generated_tokens"] == 6
    assert seen.finished[2]["prompt_tokens"] == 9 and seen.finished[2]["batched"]
    assert ("decode", 2) in runner.model.backend.calls  # one pass for both
    assert (0, 2) in [(rid, batch) for rid, batch in seen.samples]  # the dashboard heard of the batch of two


def test_the_conversation_on_screen_goes_first_and_switching_moves_it_ahead():
    shown = [20]
    runner, seen = runner_for(Limits(prefill_chunk=64, max_batch=1, pause_s=0.0), shown=lambda: shown[0])
    runner.add(reply(1, 10, [1, 2, 3], max_tokens=8))
    runner.add(reply(2, 20, [4, 5, 6], max_tokens=8))
    runner.add(reply(3, 30, [7, 8, 9], max_tokens=8))
    switched = []

    def admit(_runner):  # the user opens conversation 30 once conversation 20 has finished
        if 2 in seen.finished and not switched:
            shown[0] = 30
            switched.append(True)

    runner.hooks.admit = admit
    runner.run()
    assert seen.order == [2, 3, 1]
    assert all(seen.text[rid] for rid in (1, 2, 3))


def test_stop_cancels_one_reply_and_keeps_its_text():
    stops = set()
    runner, seen = runner_for(stopped=lambda rid: rid in stops)
    runner.add(reply(1, 10, [1, 2, 3], max_tokens=50))
    runner.add(reply(2, 20, [4, 5, 6], max_tokens=5))

    def admit(_runner):
        if 2 in seen.finished:
            stops.add(1)

    runner.hooks.admit = admit
    runner.run()
    assert seen.finished[1]["finish_reason"] == "cancelled" and 1 <= seen.finished[1]["generated_tokens"] < 50
    assert seen.text[1].split() == [str(t) for t in solo([1, 2, 3], seen.finished[1]["generated_tokens"])]
    assert seen.finished[2]["finish_reason"] == "length"


def test_a_bad_request_fails_alone():
    runner, seen = runner_for()
    runner.add(reply(1, 10, [1, 2, 3]))
    runner.add(reply(2, 20, [1, 10_000]))  # a token id the fake model does not have
    runner.run()
    assert "out of range" in seen.failed[2] and 2 not in seen.finished
    assert seen.finished[1]["finish_reason"] == "length"


def test_the_policy_rests_between_steps_in_slices_and_stop_cuts_it_short():
    stops = set()
    runner, seen = runner_for(Limits(prefill_chunk=64, max_batch=8, pause_s=0.12), stopped=lambda rid: rid in stops)
    runner.add(reply(1, 10, [1, 2, 3], max_tokens=3))
    runner.run()
    assert seen.naps == pytest.approx([0.05, 0.05, 0.02] * 2)  # after the first two of its three steps
    runner, seen = runner_for(Limits(prefill_chunk=64, max_batch=8, pause_s=0.12), stopped=lambda rid: rid in stops)
    runner.add(reply(1, 10, [1, 2, 3], max_tokens=30))

    def nap(seconds):  # Stop is pressed during the second slice of the first rest
        seen.naps.append(seconds)
        if len(seen.naps) == 2:
            stops.add(1)

    runner.sleep = nap
    runner.run()
    assert seen.naps == [0.05, 0.05] and seen.finished[1]["finish_reason"] == "cancelled"

