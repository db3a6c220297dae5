"""The app's API server: its settings and page, and requests answered by the app's own engine host, batched with
the chat's replies in one scheduler (the official ``openai`` client drives it)."""

import socket
import threading

import openai
import pytest

from app.api_server import ApiServer, AppSequences, ServerSettings
from app.engine_host import EngineHost
from app.ui.server_page import ServerPage, record_cells
from app.ui.theme import MAX_CONTENT_WIDTH
from app.worker import load_engine_model, make_sampling_params
from engine.serve.errors import APIError
from engine.serve.host import RequestRecord
from engine.serve.library import model_id
from engine.thermal import ThermalMonitor, default_provider
from tests.openai_sdk import build_sdk_models

from .fake_engine import make_cool

N_CTX = 1024
TEA = [{"role": "user", "content": "Tell me everything about the history of tea."}]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeStore:
    def __init__(self):
        self.values = {}

    def setting(self, key, default=None):
        return self.values.get(key, default)

    def set_setting(self, key, value):
        self.values[key] = value


def test_binding_another_address_needs_a_key_and_the_key_is_never_shown():
    with pytest.raises(ValueError, match="api-key"):
        ServerSettings(host="0.0.0.0").check()
    ServerSettings(host="0.0.0.0", api_key="k").check()
    ServerSettings(host="127.0.0.1").check()
    with pytest.raises(ValueError, match="port"):
        ServerSettings(port=0).check()
    settings = ServerSettings(enabled=True, host="::1", port=9000, api_key="secret-key", allowed_origins=("http://a",))
    assert "secret-key" not in repr(settings)
    assert settings.base_url == "http://[::1]:9000/v1"
    assert ServerSettings.from_dict(settings.to_dict()) == settings
    assert ServerSettings.from_dict({"port": "x", "allowed_origins": 5}) == ServerSettings()


def test_the_page_round_trips_its_settings_and_logs_requests_newest_first(qtbot):
    page = ServerPage()
    qtbot.addWidget(page)
    settings = ServerSettings(enabled=True, host="0.0.0.0", port=8123, api_key="k1", allowed_origins=("http://x",))
    page.set_settings(settings)
    assert page.settings() == settings
    with qtbot.waitSignal(page.apply_requested) as applied:
        page.apply_button.click()
    assert applied.args[0] == settings
    page.set_state({"running": True, "base_url": settings.base_url, "active": 3, "error": None})
    assert "3 requests running" in page.status.text() and page.base_url.text() == "http://0.0.0.0:8123/v1"
    page.copy_base_url()
    from PySide6.QtGui import QGuiApplication
    assert QGuiApplication.clipboard().text() == "http://0.0.0.0:8123/v1"
    page.set_state({"running": False, "base_url": "", "error": "cannot listen on 0.0.0.0:8123: in use"})
    assert "in use" in page.status.text()
    page.add_record(RequestRecord(1, "chat", "smollm2", 30, 8, 12, 0.25, 40.0, "eos", 0.0))
    page.add_record(RequestRecord(0, "messages", "nope", 0, 0, 0, 0.0, 0.0, "error", 0.0, 404))
    assert page.log.rowCount() == 2
    assert page.log.item(0, 7).text() == "404" and page.log.item(1, 7).text() == "200 eos"
    assert record_cells(RequestRecord(1, "chat", "m", 30, 8, 12, 0.25, 40.0, "eos", 0.0))[3:7] == \
        ["30 (8 cached)", "12", "250 ms", "40.0"]


@pytest.mark.qt_log_ignore("does not support propagateSizeHints")  # the offscreen plugin, a top-level page
def test_on_a_wide_window_the_fields_stop_at_the_content_width_and_the_request_log_takes_the_page(qtbot):
    page = ServerPage()
    qtbot.addWidget(page)
    page.resize(1600, 800)
    page.show()
    qtbot.waitExposed(page)
    for field in (page.address, page.api_key, page.origins, page.base_url, page.copy_button):
        assert field.mapTo(page, field.rect().topRight()).x() <= 24 + MAX_CONTENT_WIDTH, field.objectName()
    assert page.log.width() > 1400


def test_a_port_in_use_is_an_error_on_the_page_not_a_crash(qtbot):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        server = ApiServer(host=None, store=FakeStore())
        states = []
        server.state_changed.connect(states.append)
        server.apply(ServerSettings(enabled=True, port=port))
        assert not server.running and "cannot listen" in server.error
        assert states[-1]["error"] == server.error
        server.apply(ServerSettings(enabled=True, host="0.0.0.0", port=port))  # no key: refused before binding
        assert "api-key" in server.error and server.store.values["api_server"]["host"] == "0.0.0.0"


class IdleHost:
    """An engine host with a loaded model named 'a' and a reply streaming (or not)."""

    class Model:
        path = "/models/a.gguf"

    def __init__(self, streaming):
        self.model, self.streaming, self.loads = self.Model(), streaming, []

    def load(self, path, n_ctx):
        self.loads.append(path)


def test_another_library_model_waits_for_the_chat_and_a_model_that_does_not_fit_is_refused_with_why():
    library = lambda: {"a": "/models/a.gguf", "b": "/models/b.gguf"}  # noqa: E731
    busy = AppSequences(IdleHost(streaming=True), library, lambda: N_CTX)
    assert busy.model_ids() == ["a", "b"]
    assert busy.acquire("a") is busy.host.model
    with pytest.raises(APIError) as e:
        busy.acquire("b")
    assert e.value.status == 409 and "answering with a" in e.value.message and not busy.host.loads
    with pytest.raises(APIError) as e:
        busy.acquire("c")
    assert e.value.status == 404
    too_big = AppSequences(IdleHost(streaming=False), library, lambda: N_CTX,
                           refusal=lambda *a, **k: "b needs about 9.0 GB and 1.0 GB are available")
    with pytest.raises(APIError) as e:
        too_big.acquire("b")
    assert e.value.status == 503 and "9.0 GB" in e.value.message and not too_big.host.loads


@pytest.fixture
def serving(qtbot, small_model):
    host = EngineHost(load_engine_model, make_sampling_params, thermal=make_cool(ThermalMonitor(default_provider())))
    with qtbot.waitSignal(host.loaded, timeout=120000):
        host.load(small_model, N_CTX)
    server = ApiServer(host, FakeStore(), library=lambda: {model_id(small_model): small_model}, n_ctx=lambda: N_CTX)
    server.apply(ServerSettings(enabled=True, port=_free_port()))
    assert server.running, server.error
    yield host, server
    server.stop()
    host.shutdown()


@pytest.mark.slow
def test_api_requests_and_a_chat_reply_decode_in_one_batch_of_the_apps_scheduler(qtbot, serving, small_model):
    host, server = serving
    name = model_id(small_model)
    client = openai.OpenAI(base_url=server.settings.base_url, api_key="none", max_retries=0)
    assert [m.id for m in client.models.list().data] == [name]
    logged, samples, done, api = [], [], {}, {}
    server.request_logged.connect(logged.append)
    host.telemetry.connect(samples.append)
    host.finished.connect(lambda rid, stats: done.update({rid: stats}))

    def ask(i):
        stream = client.completions.create(model=name, prompt=f"Chapter {i + 1}. Once upon a time", max_tokens=200,
                                           temperature=0, stream=True)
        api[i] = ""
        for chunk in stream:  # a story goes on past the chat's reply: the two overlap
            api[i] += chunk.choices[0].text

    build_sdk_models()  # before threads parse responses at once
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    qtbot.waitUntil(lambda: len(api) == 3 and all(api.values()), timeout=120000)  # all three stream now
    rid = host.generate(small_model, N_CTX, TEA, {"max_tokens": 32, "temperature": 0.0})
    qtbot.waitUntil(lambda: rid in done and len(logged) == 3, timeout=240000)
    for t in threads:
        t.join(timeout=60)
    assert done[rid]["batched"]  # the chat's reply decoded in passes with the API's sequences
    assert max(s.batch for s in samples) >= 2  # the dashboard counts the API's sequences
    assert sorted(r.endpoint for r in logged) == ["completions"] * 3 and all(r.completion_tokens > 0 for r in logged)
    assert all(api[i] for i in range(3))
    assert server.served.active == 0 and not host.model.scheduler.has_work


@pytest.mark.slow
def test_an_api_request_alone_is_stepped_by_the_engine_thread_and_stopping_the_server_ends_streams(qtbot, serving,
                                                                                                 small_model):
    host, server = serving
    client = openai.OpenAI(base_url=server.settings.base_url, api_key="none", max_retries=0)
    reply = client.completions.create(model=model_id(small_model), prompt="The capital of France is", max_tokens=8,
                                      temperature=0)
    assert reply.usage.completion_tokens == 8 and reply.choices[0].text
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="not-in-the-library", prompt="x", max_tokens=2)
    qtbot.waitUntil(lambda: server.served.stats.log[-1].status == 404, timeout=5000)


def test_the_form_follows_the_servers_settings_but_a_report_does_not_undo_an_edit(qtbot):
    page = ServerPage()
    qtbot.addWidget(page)
    applied = ServerSettings(enabled=True, port=9100)
    page.set_state({"running": True, "base_url": applied.base_url, "active": 1, "settings": applied})
    assert page.settings() == applied and "1 request running" in page.status.text()
    page.port.setValue(9200)  # the user edits; the next report carries the same server settings
    page.set_state({"running": True, "base_url": applied.base_url, "active": 2, "settings": applied})
    assert page.port.value() == 9200 and "2 requests running" in page.status.text()


@pytest.mark.slow
def test_a_request_for_a_library_model_loads_it_in_the_app_when_nothing_streams(qtbot, small_model):
    host = EngineHost(load_engine_model, make_sampling_params, thermal=make_cool(ThermalMonitor(default_provider())))
    server = ApiServer(host, FakeStore(), library=lambda: {model_id(small_model): small_model}, n_ctx=lambda: N_CTX)
    server.apply(ServerSettings(enabled=True, port=_free_port()))
    try:
        assert host.model is None
        client = openai.OpenAI(base_url=server.settings.base_url, api_key="none", max_retries=0, timeout=300)
        result = {}
        ask = threading.Thread(target=lambda: result.update(reply=client.completions.create(
            model=model_id(small_model), prompt="The capital of France is", max_tokens=4, temperature=0)))
        with qtbot.waitSignal(host.loaded, timeout=120000) as loaded:  # the app loads it, as its own model
            ask.start()
        assert loaded.args[0]["path"] == small_model
        qtbot.waitUntil(lambda: "reply" in result, timeout=120000)
        assert result["reply"].usage.completion_tokens == 4 and str(host.model.path) == small_model
    finally:
        server.stop()
        host.shutdown()
