"""Speculative decoding in the worker and the window on the real test models: figures, exact greedy text, bad
drafts, and the acceptance and estimated speed-up under the answer and on the dashboard."""

import dataclasses
from types import SimpleNamespace

import pytest

from app.speculation import estimated_speedup, speculation_stats
from app.worker import load_engine_model, make_sampling_params
from tests.model_store import model_path

from .test_worker import collect, host_for  # noqa: F401 - host_for is a fixture

pytestmark = pytest.mark.slow

N_CTX = 2048
PASSAGE = ("The lighthouse keeper climbed the spiral stairs every evening at dusk, trimmed the wick, polished the "
           "great lens and wrote the weather in a leather logbook: wind from the west, sea calm, two ships passed.")
COPY_PROMPT = [{"role": "user", "content": f"Repeat this text word for word, twice:\n\n{PASSAGE}"}]
LOADS = 120000  # ms: loading a model on a busy 2-core machine
ANSWER = 300000


def greedy(mode, draft="", max_tokens=96):
    return {"max_tokens": max_tokens, "temperature": 0.0, "repeat_penalty": 1.0,
            "speculation": {"mode": mode, "draft_model": draft, "max_draft": 8}}


def answer(qtbot, host, got, path, options, messages=COPY_PROMPT):
    got["text"].clear()
    with qtbot.waitSignal(host.finished, timeout=ANSWER) as finished:
        host.generate(path, N_CTX, messages, options)
    return "".join(got["text"]), finished.args[1]


def first_difference(a: str, b: str) -> str:
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"the texts part at character {at}: {a[at - 20:at + 20]!r} vs {b[at - 20:at + 20]!r}"


class CountingFactory:
    """The app's engine factory, counting loads per path."""

    def __init__(self):
        self.loads = []

    def __call__(self, path, n_ctx):
        self.loads.append(path)
        return load_engine_model(path, n_ctx)


@pytest.fixture
def smollm2_host(qtbot, host_for):  # noqa: F811
    factory = CountingFactory()
    host = host_for(factory, make_sampling_params)
    return host, collect(host), factory


def test_prompt_lookup_drafts_on_a_copying_answer_and_keeps_the_greedy_text(qtbot, smollm2_host):
    host, got, _ = smollm2_host
    target = str(model_path("smollm2"))
    plain_text, plain = answer(qtbot, host, got, target, greedy("off"))
    spec_text, spec = answer(qtbot, host, got, target, greedy("lookup"))
    assert "speculation" not in plain and "drafted_tokens" not in plain
    assert spec["speculation"] == "prompt lookup" and spec["drafted_tokens"] > 0
    assert spec_text == plain_text, first_difference(spec_text, plain_text)
    assert spec["generated_tokens"] == plain["generated_tokens"]
    assert 0 <= spec["accepted_tokens"] <= spec["drafted_tokens"]
    assert spec["acceptance_rate"] == pytest.approx(spec["accepted_tokens"] / spec["drafted_tokens"], abs=1e-4)
    passes = spec["verify_passes"]
    assert spec["tokens_per_verify"] == pytest.approx((spec["accepted_tokens"] + passes) / passes, abs=1e-3)
    print(f"\nprompt lookup: {spec['accepted_tokens']}/{spec['drafted_tokens']} drafts kept, "
          f"{spec['decode_tps']} tok/s vs {plain['decode_tps']} plain, estimated {spec.get('speedup_estimate')}x")


def test_a_draft_model_sharing_the_vocabulary_drafts_and_is_loaded_once(qtbot, smollm2_host):
    host, got, factory = smollm2_host
    target = str(model_path("smollm2"))
    plain_text, _ = answer(qtbot, host, got, target, greedy("off", max_tokens=40))
    for _ in range(2):
        text, stats = answer(qtbot, host, got, target, greedy("draft", target, max_tokens=40))
        assert text == plain_text, first_difference(text, plain_text)
        assert stats["speculation"].startswith("draft ") and "speculation_notice" not in stats
        # the speculator made every token after the first (whether drafting pays a model as slow as the target
        # is the adaptive controller's call on this machine's timings, so drafts may be few or none)
        made = 1 + stats["accepted_tokens"] + stats["verify_passes"] + stats["plain_steps"]
        assert made >= stats["generated_tokens"] > 1
    assert factory.loads == [target, target]  # the target, then the draft once for both answers


def test_a_draft_model_with_another_vocabulary_gives_a_notice_and_a_plain_answer(qtbot, smollm2_host):
    host, got, factory = smollm2_host
    target, qwen = str(model_path("smollm2")), str(model_path("qwen25coder"))
    plain_text, _ = answer(qtbot, host, got, target, greedy("off", max_tokens=24))
    for _ in range(2):
        text, stats = answer(qtbot, host, got, target, greedy("draft", qwen, max_tokens=24))
        assert text == plain_text and stats["finish_reason"] in ("eos", "length")
        assert "speculation" not in stats
        notice = stats["speculation_notice"]
        assert f"The draft model {model_path('qwen25coder').name} cannot be used" in notice
        assert "vocabulary" in notice and "without speculative decoding" in notice
    assert factory.loads == [target, qwen]  # a draft that failed is not loaded again for every answer


def test_a_missing_draft_model_gives_a_notice(qtbot, smollm2_host, tmp_path):
    host, got, _ = smollm2_host
    missing = str(tmp_path / "gone.gguf")
    text, stats = answer(qtbot, host, got, str(model_path("smollm2")), greedy("draft", missing, max_tokens=8))
    assert text and "gone.gguf cannot be used" in stats["speculation_notice"]
    text, stats = answer(qtbot, host, got, str(model_path("smollm2")), greedy("draft", "", max_tokens=8))
    assert text and stats["speculation_notice"].startswith("No draft model is chosen")


def test_the_estimated_speedup_compares_with_the_measured_plain_step():
    assert estimated_speedup(30.0, 0.05) == pytest.approx(1.5)  # 30 tok/s where a plain step took 50 ms
    assert estimated_speedup(30.0, None) is None and estimated_speedup(0.0, 0.05) is None


@pytest.mark.parametrize("step_s, expected", [(0.05, 1.5), (None, None)])
def test_a_replys_stats_carry_the_estimate_exactly_when_a_plain_step_was_measured(step_s, expected):
    stats_of = SimpleNamespace(proposed=10, accepted=7, verify_passes=4, plain_steps=2, acceptance_rate=0.7,
                               tokens_per_verify=2.75)
    speculator = SimpleNamespace(stats=stats_of, controller=SimpleNamespace(costs=SimpleNamespace(step_s=step_s)))
    stats = speculation_stats(speculator, "prompt lookup", 30.0)
    assert (stats["drafted_tokens"], stats["accepted_tokens"]) == (10, 7)
    assert stats.get("speedup_estimate") == expected


@pytest.mark.gui
def test_the_answer_and_the_dashboard_show_acceptance_and_the_estimated_speedup(small_model, qtbot, make_session):
    session = make_session(model=small_model)  # SmolLM2; conversations start with prompt lookup on
    c = session.controller
    c.update_settings(dataclasses.replace(c.settings(), max_tokens=96, temperature=0.0, repeat_penalty=1.0))
    assert c.settings().speculation == "lookup"
    qtbot.waitUntil(lambda: bool(c.model_info), timeout=LOADS)
    window, telemetry = session.window, session.telemetry
    window.show_page("dashboard")
    samples = []
    telemetry.engine_sampled.connect(samples.append)
    with qtbot.waitSignal(c.reply_finished, timeout=ANSWER) as finished:
        c.send(COPY_PROMPT[0]["content"])
    message_id, stats = finished.args
    assert stats["speculation"] == "prompt lookup" and stats["drafted_tokens"] > 0
    line = window.chat_view.widgets[message_id]._stats
    assert "accepted" not in line.text() and "tok/s" in line.text()  # the line is plain; the details are its tooltip
    shown = line.toolTip()
    assert f"prompt lookup: {stats['accepted_tokens']:,} of {stats['drafted_tokens']:,} drafted tokens accepted" in shown
    # the estimate exists once a plain step was measured; either way the answer shows exactly what the stats hold
    estimate = stats.get("speedup_estimate")
    assert ("× plain speed (estimated)" in shown) == (estimate is not None)
    assert estimate is None or f"~{estimate:.2f}× plain speed (estimated)" in shown
    assert any(s.phase == "decode" and s.speculation == "prompt lookup" for s in samples)  # live, while streaming
    last = telemetry.engine
    assert (last.phase, last.drafted_tokens, last.accepted_tokens) == ("idle", stats["drafted_tokens"],
                                                                       stats["accepted_tokens"])
    qtbot.waitUntil(lambda: "prompt lookup:" in window.dashboard.cards["decode"].legend.text(), timeout=10000)
