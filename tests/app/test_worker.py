"""The engine worker and its host: streaming every step, stop, crash restart, load failures, GUI responsiveness."""

import pytest
from PySide6.QtCore import QElapsedTimer, QTimer

from app.engine_host import EngineHost
from app.worker import load_engine_model, make_sampling_params
from engine.context import ContextOverflowError
from engine.gguf_file import ModelFormatError

from .fake_engine import FakeFactory, FakeModel

MESSAGES = [{"role": "user", "content": "hi"}]


def identity(options):
    return options


@pytest.fixture
def host_for(qtbot):
    hosts = []

    def make(factory, params_factory=identity):
        host = EngineHost(factory, params_factory)
        hosts.append(host)
        return host

    yield make
    for host in hosts:
        host.shutdown()


def collect(host):
    got = {"text": [], "finished": [], "errors": [], "restarted": []}
    host.tokens.connect(lambda rid, text: got["text"].append(text))
    host.finished.connect(lambda rid, stats: got["finished"].append(stats))
    host.error.connect(lambda rid, msg: got["errors"].append(msg))
    host.restarted.connect(lambda msg: got["restarted"].append(msg))
    return got


def test_streamed_text_is_delivered_every_step_and_complete(qtbot, host_for):
    pieces = [f"t{i} " for i in range(120)]
    host = host_for(FakeFactory(FakeModel(pieces, token_s=0.002)))
    got = collect(host)
    with qtbot.waitSignal(host.finished, timeout=20000):
        host.generate("/m.gguf", 4096, MESSAGES, {"max_tokens": 500})
    assert "".join(got["text"]) == "".join(pieces)
    assert got["text"] == pieces  # one emit per token: none held back for a later step (the view coalesces)
    stats = got["finished"][0]
    assert stats["finish_reason"] == "eos" and stats["generated_tokens"] == 120
    assert stats["context_used"] == 10 + 120 and stats["n_ctx"] == 4096


def test_stop_ends_the_answer_early(qtbot, host_for):
    host = host_for(FakeFactory(FakeModel(["x"] * 2000, token_s=0.005)))
    got = collect(host)
    with qtbot.waitSignal(host.tokens, timeout=20000):
        request = host.generate("/m.gguf", 4096, MESSAGES, {"max_tokens": 2000})
    with qtbot.waitSignal(host.finished, timeout=20000) as finished:
        host.stop(request)
    stats = finished.args[1]
    assert stats["finish_reason"] == "cancelled"
    assert stats["generated_tokens"] < 2000 and len("".join(got["text"])) == stats["generated_tokens"]


def test_stop_before_the_request_starts_stops_it_and_only_it(qtbot, host_for):
    model = FakeModel(["x"] * 50, prefill_s=0.3)
    host = host_for(FakeFactory(model))
    first = host.generate("/m.gguf", 4096, MESSAGES, {"max_tokens": 50})
    second = host.generate("/m.gguf", 4096, MESSAGES, {"max_tokens": 50})
    finished = {}
    host.finished.connect(lambda rid, stats: finished.update({rid: stats}))
    host.stop(second)  # `first` is running (or about to): it goes on
    qtbot.waitUntil(lambda: len(finished) == 2, timeout=20000)
    assert finished[second]["finish_reason"] == "cancelled" and finished[second]["generated_tokens"] == 0
    assert finished[first]["finish_reason"] == "eos" and finished[first]["generated_tokens"] == 50


def test_a_crash_is_reported_and_the_worker_restarted(qtbot, host_for):
    good = FakeModel(["fine"])
    factory = FakeFactory(FakeModel(fail_with=RuntimeError("kernel exploded")), good)
    host = host_for(factory)
    got = collect(host)
    with qtbot.waitSignal(host.restarted, timeout=20000):
        host.generate("/m.gguf", 4096, MESSAGES, {"max_tokens": 5})
    assert got["errors"] == ["Kernel exploded"] and "RuntimeError: kernel exploded" in got["restarted"][0]
    assert host.restarts == 1
    with qtbot.waitSignal(host.finished, timeout=20000):
        host.generate("/m.gguf", 4096, MESSAGES, {"max_tokens": 5})
    assert got["text"] == ["fine"] and len(factory.loads) >= 2


def test_a_bad_model_file_is_a_load_failure_not_a_crash(qtbot, host_for):
    host = host_for(FakeFactory(ModelFormatError("not a GGUF file: bad magic")))
    got = collect(host)
    with qtbot.waitSignal(host.load_failed, timeout=20000) as failed:
        host.load("/bad.gguf", 4096)
    assert failed.args == ["/bad.gguf", "Not a GGUF file: bad magic"]
    with qtbot.waitSignal(host.error, timeout=20000):
        host.generate("/bad.gguf", 4096, MESSAGES, {"max_tokens": 5})
    assert "Could not load the model" in got["errors"][0]
    assert host.restarts == 0 and got["restarted"] == []


def test_context_overflow_is_an_error_without_restart(qtbot, host_for):
    host = host_for(FakeFactory(FakeModel(fail_with=ContextOverflowError("the last message alone does not fit"))))
    got = collect(host)
    with qtbot.waitSignal(host.error, timeout=20000):
        host.generate("/m.gguf", 4096, MESSAGES, {"max_tokens": 5})
    qtbot.wait(100)
    assert got["errors"] == ["The last message alone does not fit"] and host.restarts == 0


def test_out_of_memory_is_explained_and_the_worker_restarted(qtbot, host_for):
    host = host_for(FakeFactory(FakeModel(fail_with=MemoryError()), FakeModel()))
    got = collect(host)
    with qtbot.waitSignal(host.restarted, timeout=20000):
        host.generate("/m.gguf", 8192, MESSAGES, {"max_tokens": 5})
    assert got["errors"] == ["Not enough memory for this model or context length. Try a smaller context length "
                             "or model."] and host.restarts == 1


def test_switching_model_or_context_reloads(qtbot, host_for):
    factory = FakeFactory(FakeModel())
    host = host_for(factory)
    for path, n_ctx in (("/a.gguf", 4096), ("/a.gguf", 4096), ("/a.gguf", 2048), ("/b.gguf", 2048)):
        with qtbot.waitSignal(host.finished, timeout=20000):
            host.generate(path, n_ctx, MESSAGES, {"max_tokens": 5})
    assert factory.loads == [("/a.gguf", 4096), ("/a.gguf", 2048), ("/b.gguf", 2048)]


@pytest.mark.slow
def test_gui_stays_responsive_while_a_512_token_prompt_is_prefilled(qtbot, host_for, small_model):
    """A 10 ms QTimer keeps ticking at >= 30 Hz on the GUI thread during prefill, never pausing over 100 ms."""
    host = host_for(load_engine_model, make_sampling_params)
    with qtbot.waitSignal(host.loaded, timeout=120000):
        host.load(small_model, 4096)
    prompt = "Summarise this text. " + "The quick brown fox jumps over the lazy dog near the river bank. " * 40
    ticks, clock = [], QElapsedTimer()
    timer = QTimer(interval=10)
    timer.timeout.connect(lambda: ticks.append(clock.elapsed()))
    first_text = []
    host.tokens.connect(lambda rid, text: first_text.append(clock.elapsed()) if not first_text else None)
    clock.start()
    timer.start()
    with qtbot.waitSignal(host.finished, timeout=600000) as finished:
        host.generate(small_model, 4096, [{"role": "user", "content": prompt}],
                      {"max_tokens": 2, "temperature": 0.0})
    timer.stop()
    stats = finished.args[1]
    assert stats["prompt_tokens"] - stats["cached_tokens"] >= 512
    prefill_end = first_text[0] if first_text else clock.elapsed()
    during = [t for t in ticks if t <= prefill_end]
    rate = len(during) / (prefill_end / 1000)
    gaps = [b - a for a, b in zip(during, during[1:])]
    print(f"\nprefill of {stats['prompt_tokens']} tokens: {stats['prefill_s']:.2f} s in the engine; "
          f"GUI timer {rate:.1f} Hz during prefill, longest gap {max(gaps)} ms")
    assert rate >= 30, f"the GUI thread ticked at {rate:.1f} Hz during prefill (longest gap {max(gaps)} ms)"
    assert max(gaps) <= 100, f"the GUI thread paused {max(gaps)} ms during prefill"
