"""Engine faults: a model that computes NaN, running out of memory while loading, cancelling at any moment."""

import os

os.environ["QT_QPA_PLATFORM"] = "offscreen"  # before anything imports Qt

import random  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402

import gguf  # noqa: E402
import numpy as np  # noqa: E402
import psutil  # noqa: E402
import pytest  # noqa: E402

import engine.model  # noqa: E402
from app.engine_host import EngineHost  # noqa: E402
from app.worker import load_engine_model  # noqa: E402
from engine.backends.cpu_backend import CpuBackend  # noqa: E402
from engine.backends.numpy_backend import NumpyBackend  # noqa: E402
from engine.gguf_file import ModelFormatError  # noqa: E402
from engine.sampling import NonFiniteLogitsError, SamplingParams  # noqa: E402
from tests.engine.gguf_builders import DEFAULT_TYPES, TINY_VOCAB_SIZE, tiny_vocab, write_tiny_llama  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
GREEDY = SamplingParams(temperature=0.0)
OPTIONS = {"temperature": 0.0, "max_tokens": 8}  # the worker turns these into GREEDY and 8 new tokens
MESSAGES = [{"role": "user", "content": "hi"}]
LONG_MESSAGES = [{"role": "user", "content": " ".join(f"word{i}" for i in range(120))}]  # several prefill chunks
N_CTX = 1024
PROMPT = [random.Random(7).randrange(3, 260) for _ in range(320)]  # token ids of the tiny vocabulary
CHUNK = 32  # prefill chunk: PROMPT takes 10
N_NEW = 12
BACKENDS = ("numpy", "cpu")


def write_nan_model(path: Path) -> Path:
    """The tiny model with NaN in its final norm: every forward pass ends in NaN logits."""
    write_tiny_llama(path, tensor_types={"output_norm.weight": "F32"})
    reader = gguf.GGUFReader(path, "r+")
    (norm,) = [t for t in reader.tensors if t.name == "output_norm.weight"]
    norm.data[...] = np.nan
    reader.data.flush()
    return path


def write_sharp_model(path: Path) -> Path:
    """A tiny model whose greedy tokens depend on their context: float32 weights scaled up 30 times.

    The builder's weights (spread 0.02) make attention almost uniform, so even a wrong KV cache would barely
    move the logits; scaled up, a cache holding the wrong tokens changes the answer (see the control test).
    """
    write_tiny_llama(path, n_ctx=N_CTX, tensor_types={name: "F32" for name in DEFAULT_TYPES})
    reader = gguf.GGUFReader(path, "r+")
    for tensor in reader.tensors:
        if tensor.data.ndim == 2:
            tensor.data[...] *= 30.0
    reader.data.flush()
    return path


@pytest.fixture(scope="module")
def nan_model_path(tmp_path_factory) -> Path:
    return write_nan_model(tmp_path_factory.mktemp("nan") / "nan.gguf")


@pytest.fixture(scope="module")
def sharp_model_path(tmp_path_factory) -> Path:
    return write_sharp_model(tmp_path_factory.mktemp("sharp") / "sharp.gguf")


def greedy(model, prompt=PROMPT) -> list[tuple[int, float]]:
    return [(e.id, e.logprob) for e in model.generate_ids(list(prompt), GREEDY, N_NEW, prefill_chunk=CHUNK)]


def load_sharp(path: Path, backend: str):
    """The sharp model without end-of-generation tokens, so every answer runs to its length."""
    model = engine.model.load(path, backend=backend, n_ctx=N_CTX)
    model.tokenizer.eog_ids = frozenset()
    return model


@pytest.fixture(scope="module", params=BACKENDS)
def fresh(request, sharp_model_path):
    """(backend name, the greedy tokens and logprobs of a freshly loaded model for PROMPT)."""
    model = load_sharp(sharp_model_path, request.param)
    try:
        return request.param, greedy(model)
    finally:
        model.close()


def assert_same_answer(got: list[tuple[int, float]], want: list[tuple[int, float]]) -> None:
    assert [t for t, _ in got] == [t for t, _ in want]
    np.testing.assert_allclose([lp for _, lp in got], [lp for _, lp in want], atol=1e-4)


def fresh_chat_text(path: Path, messages: list[dict]) -> str:
    """What a freshly loaded model answers through ``chat``, as the worker would ask it."""
    model = engine.model.load(path, backend="auto", n_ctx=N_CTX)
    try:
        _, events = model.chat(messages, params=GREEDY, max_tokens=OPTIONS["max_tokens"])
        return "".join(e.text for e in events)
    finally:
        model.close()


# -- a model that computes NaN ------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_logits_are_a_clear_error_from_generate_and_chat(nan_model_path, backend):
    model = engine.model.load(nan_model_path, backend=backend)
    try:
        with pytest.raises(NonFiniteLogitsError, match="the model computed NaN or infinite scores .* damaged"):
            list(model.generate("hello", max_tokens=4))
        _, events = model.chat(MESSAGES, params=SamplingParams(temperature=0.8, seed=1), max_tokens=4)
        with pytest.raises(NonFiniteLogitsError, match="the model computed NaN or infinite scores"):
            list(events)
    finally:
        model.close()


def test_a_tokenizer_with_more_tokens_than_embeddings_is_refused_at_load(tmp_path):
    """Its extra token ids would reach the backend's embedding lookup; llama.cpp refuses such files too."""
    tokens, types, _ = tiny_vocab()
    path = write_tiny_llama(tmp_path / "extra-token.gguf", metadata={
        "tokenizer.ggml.tokens": tokens + ["<|extra|>"],
        "tokenizer.ggml.token_type": (types + [int(gguf.TokenType.CONTROL)], gguf.GGUFValueType.ARRAY,
                                      gguf.GGUFValueType.INT32)})
    with pytest.raises(ModelFormatError, match=f"the tokenizer has {TINY_VOCAB_SIZE + 1} tokens but "
                                               f"token_embd.weight has only {TINY_VOCAB_SIZE} rows"):
        engine.model.load(path)


# -- through the app's worker -------------------------------------------------------------------------------
@pytest.fixture
def make_host(qtbot):
    hosts = []

    def make(factory=load_engine_model) -> EngineHost:
        host = EngineHost(factory)
        hosts.append(host)
        return host

    yield make
    for host in hosts:
        host.shutdown()


def collect(host: EngineHost) -> dict[str, list]:
    got = {"text": [], "errors": [], "restarted": []}
    host.tokens.connect(lambda rid, text: got["text"].append(text))
    host.error.connect(lambda rid, message: got["errors"].append(message))
    host.restarted.connect(got["restarted"].append)
    return got


def test_a_nan_model_is_reported_and_the_worker_answers_the_next_request(qtbot, make_host, nan_model_path,
                                                                         sharp_model_path):
    host = make_host()
    got = collect(host)
    with qtbot.waitSignal(host.error, timeout=60_000) as error:
        host.generate(str(nan_model_path), N_CTX, MESSAGES, OPTIONS)
    assert error.args[1].startswith("The model computed NaN or infinite scores for the next token")
    with qtbot.waitSignal(host.finished, timeout=60_000) as finished:
        host.generate(str(sharp_model_path), N_CTX, MESSAGES, OPTIONS)
    assert finished.args[1]["generated_tokens"] == OPTIONS["max_tokens"]
    assert "".join(got["text"]) == fresh_chat_text(sharp_model_path, MESSAGES)
    # a property of the model file, not a worker left in doubt: no restart, and no "unexpected error" notice
    assert host.restarts == 0 and got["restarted"] == [] and len(got["errors"]) == 1


def test_a_hostile_chat_template_is_not_run_the_user_is_told_and_the_chat_works(qtbot, make_host, tmp_path):
    """The template tries to reach Python internals: it is refused at load, the window says why, ChatML is used."""
    from app.chat_controller import ChatController
    from app.store import ConversationStore

    path = write_tiny_llama(tmp_path / "hostile.gguf", metadata={
        "tokenizer.chat_template": "{{ cycler.__init__.__globals__.os.system('touch pwned') }}"})
    store = ConversationStore(tmp_path / "conversations.db")
    controller = ChatController(store, make_host(), default_model=str(path))
    notices, answers = [], []
    controller.notice.connect(lambda kind, text: notices.append((kind, text)))
    controller.reply_finished.connect(lambda message_id, stats: answers.append(store.message(message_id)))
    try:
        with qtbot.waitSignal(controller.model_changed, timeout=60_000):
            controller.start()
        with qtbot.waitSignal(controller.reply_finished, timeout=60_000):
            controller.send("hello")
    finally:
        controller.stop_and_forget()
        store.close()
    ((kind, text),) = [(kind, text) for kind, text in notices if "chat template" in text]
    assert kind == "info" and text.startswith("The model's chat template could not be used (")
    assert text.endswith("; using the built-in ChatML format.")
    assert answers[0].state == "complete" and answers[0].stats["generated_tokens"] > 0
    assert not (REPO / "pwned").exists() and not Path("pwned").exists()


def test_a_request_sent_while_the_worker_crashes_is_answered_not_lost(qtbot, make_host, sharp_model_path):
    broken = [True]

    def factory(path: str, n_ctx: int):
        model = load_engine_model(path, n_ctx)
        if broken[0]:  # the first model hits a bug no classification expects; the reloaded one works
            broken[0] = False
            model.start_chat = lambda *args, **kwargs: (_ for _ in ()).throw(RuntimeError("a bug in a kernel"))
        return model

    host = make_host(factory)
    got = collect(host)
    answers: dict[int, str] = {}
    host.finished.connect(lambda rid, stats: answers.setdefault(rid, stats["finish_reason"]))
    host.error.connect(lambda rid, message: answers.setdefault(rid, message))
    with qtbot.waitSignal(host.error, timeout=60_000):
        host.generate(str(sharp_model_path), N_CTX, MESSAGES, OPTIONS)
    sent_during_the_crash = host.generate(str(sharp_model_path), N_CTX, MESSAGES, OPTIONS)  # before the restart
    qtbot.waitUntil(lambda: sent_during_the_crash in answers, timeout=60_000)
    assert host.restarts == 1 and len(got["restarted"]) == 1
    got["text"].clear()
    with qtbot.waitSignal(host.finished, timeout=60_000):
        host.generate(str(sharp_model_path), N_CTX, MESSAGES, OPTIONS)
    assert "".join(got["text"]) == fresh_chat_text(sharp_model_path, MESSAGES)


def maps_file(path: Path) -> bool:
    """True while this process has ``path`` open or memory-mapped."""
    process, target = psutil.Process(), str(path.resolve())
    return any(f.path == target for f in process.open_files()) or \
        any(m.path == target for m in process.memory_maps(grouped=True))


def test_out_of_memory_while_loading_is_reported_and_the_worker_stays_usable(qtbot, make_host, monkeypatch,
                                                                            tmp_path):
    path = write_sharp_model(tmp_path / "big.gguf")
    out_of_memory = [True]
    for cls in (NumpyBackend, CpuBackend):  # whichever "auto" picks; CpuBackend builds on NumpyBackend
        def init(self, *args, _original=cls.__init__, **kwargs):
            if out_of_memory[0]:
                raise MemoryError()
            _original(self, *args, **kwargs)
        monkeypatch.setattr(cls, "__init__", init)
    host = make_host()
    got = collect(host)
    with qtbot.waitSignal(host.load_failed, timeout=60_000) as failed:
        host.load(str(path), N_CTX)
    assert failed.args == [str(path), ("Not enough memory for this model or context length. Try a smaller "
                                       "context length or model.")]
    qtbot.waitUntil(lambda: not maps_file(path), timeout=10_000)  # the half-loaded file is let go
    with qtbot.waitSignal(host.error, timeout=60_000) as error:
        host.generate(str(path), N_CTX, MESSAGES, OPTIONS)
    assert error.args[1].startswith("Could not load the model: Not enough memory")
    out_of_memory[0] = False
    with qtbot.waitSignal(host.finished, timeout=60_000) as finished:
        host.generate(str(path), N_CTX, MESSAGES, OPTIONS)
    assert finished.args[1]["generated_tokens"] == OPTIONS["max_tokens"]
    assert "".join(got["text"]) == fresh_chat_text(path, MESSAGES)


def test_stop_while_the_model_loads_ends_the_request_before_the_prompt_is_read(qtbot, make_host, sharp_model_path):
    loading, go_on = threading.Event(), threading.Event()

    def slow_load(path: str, n_ctx: int):
        loading.set()
        go_on.wait(60)
        return load_engine_model(path, n_ctx)

    host = make_host(slow_load)
    got = collect(host)
    request = host.generate(str(sharp_model_path), N_CTX, LONG_MESSAGES, OPTIONS)
    assert loading.wait(60)
    host.stop(request)
    go_on.set()
    with qtbot.waitSignal(host.finished, timeout=60_000) as finished:
        pass
    assert finished.args[1]["finish_reason"] == "cancelled"
    assert finished.args[1]["generated_tokens"] == 0 and got["text"] == []  # no prefill ran for nothing
    with qtbot.waitSignal(host.finished, timeout=60_000) as finished:
        host.generate(str(sharp_model_path), N_CTX, LONG_MESSAGES, OPTIONS)
    assert "".join(got["text"]) == fresh_chat_text(sharp_model_path, LONG_MESSAGES)


# -- cancelling at any moment leaves the engine ready ---------------------------------------------------------
def cancel_in_forward(model, call: int) -> None:
    """Make ``model.cancel()`` land while the backend computes its ``call``-th forward pass."""
    forward, calls = model.backend.forward, [0]

    def counted(*args, **kwargs):
        calls[0] += 1
        if calls[0] == call:
            model.cancel()
        return forward(*args, **kwargs)

    model.backend.forward = counted


def right_after_load(model, rng):
    model.cancel()  # before any generation: must not leak into the next one


def during_prefill(model, rng):
    chunk = rng.randrange(1, len(PROMPT) // CHUNK)
    cancel_in_forward(model, chunk)
    assert greedy(model) == []  # stopped between prefill chunks, before a first token
    assert model.kv_cache_usage.used_positions == chunk * CHUNK


def during_the_first_decode_step(model, rng):
    cancel_in_forward(model, len(PROMPT) // CHUNK + 1)
    events = list(model.generate_ids(PROMPT, GREEDY, 100, prefill_chunk=CHUNK))
    assert [e.finish_reason for e in events] == [None, "cancelled"]


def during_decode(model, rng):
    at = rng.randrange(0, 30)
    events = []
    for event in model.generate_ids(PROMPT, GREEDY, 100, prefill_chunk=CHUNK):
        events.append(event)
        if event.index == at:
            model.cancel()
    assert len(events) == at + 2 and events[-1].finish_reason == "cancelled"


def abandoned_mid_decode(model, rng):
    """The worker's way: stop iterating and close the generator."""
    at = rng.randrange(0, 30)
    events = model.generate_ids(PROMPT, GREEDY, 100, prefill_chunk=CHUNK)
    for event in events:
        if event.index == at:
            break
    events.close()


def from_another_thread(model, rng):
    """Wherever the cancel lands (prefill or decode; on a loaded machine, possibly after the end)."""
    timer = threading.Timer(rng.uniform(0.0, 0.05), model.cancel)  # decoding to n_ctx takes longer
    timer.start()
    try:
        list(model.generate_ids(PROMPT, GREEDY, N_CTX - len(PROMPT), prefill_chunk=CHUNK))
    finally:
        timer.cancel()
        timer.join()  # a cancel that fires late must not land in the follow-up instead


MOMENTS = [right_after_load, during_prefill, during_prefill, during_the_first_decode_step, during_decode,
           during_decode, abandoned_mid_decode, from_another_thread, from_another_thread]


@pytest.mark.parametrize("case", range(len(MOMENTS)), ids=[f"{i}-{m.__name__}" for i, m in enumerate(MOMENTS)])
def test_after_a_cancel_the_same_model_answers_like_a_fresh_one(fresh, sharp_model_path, case):
    backend, want = fresh
    model = load_sharp(sharp_model_path, backend)
    try:
        MOMENTS[case](model, random.Random(case))
        vars(model.backend).pop("forward", None)  # the counting wrapper, if any
        assert_same_answer(greedy(model), want)
        assert_same_answer(greedy(model), want)  # and again, now from a cache the follow-up left behind
    finally:
        model.close()


def test_the_comparison_notices_a_kv_cache_that_holds_other_tokens(fresh, sharp_model_path):
    """Control: if a cancel left keys and values of other tokens behind, the answers above would differ."""
    backend, want = fresh
    model = load_sharp(sharp_model_path, backend)
    try:
        other = [random.Random(1).randrange(3, 260) for _ in range(64)]
        list(model.generate_ids(PROMPT[:-65] + other + PROMPT[-1:], GREEDY, 1, prefill_chunk=CHUNK))
        model._tokens = PROMPT[:model.kv_cache_usage.used_positions]  # the bug: the cache "holds" PROMPT
        assert [t for t, _ in greedy(model)] != [t for t, _ in want]
    finally:
        model.close()
