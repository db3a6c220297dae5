"""The remote client and RemoteScheduler against a misbehaving fake server: each fault gives its own clear error,
the text that arrived is kept, Stop closes the stream, 429 is retried after Retry-After, the endpoint comes back."""

from __future__ import annotations

import json
import threading
import time

import pytest

from engine.remote import (AuthenticationFailed, Endpoint, EndpointUnreachable, MalformedStream, ModelNotFound,
                           RateLimited, RemoteClient, RemoteModel, RemoteScheduler, ServerError, StreamChunk,
                           StreamStalled, TruncatedStream)
from engine.remote.client import chat_request, sse_data
from engine.remote.model import parse_remote_ref, remote_ref
from engine.scheduler import RequestEvent
from engine.cli import main
from engine.sampling import SamplingParams
from tests.engine.remote.fake_server import KEY

from .servers import FakeServer


def run(model: RemoteModel, cancel: threading.Event | None = None, stop_after_chars: int | None = None,
        timeout: float = 20.0):
    """Step ``model``'s scheduler until the reply ends; returns (text, last event)."""
    cancel = cancel or threading.Event()
    _, handle = model.start_chat([{"role": "user", "content": "Hi"}], SamplingParams(temperature=0.0), 64,
                                 cancel=cancel)
    text, deadline = "", time.monotonic() + timeout
    while time.monotonic() < deadline:
        model.scheduler.step()
        for event in handle.ready():
            if isinstance(event, RequestEvent):
                return text, event
            text += event.text
            if event.finish_reason is not None:
                return text, event
            if stop_after_chars is not None and len(text) >= stop_after_chars:
                cancel.set()
    raise AssertionError(f"no end within {timeout} s; text so far {text!r}")


def test_sse_data_joins_lines_and_skips_comments():
    lines = [": keep-alive", "event: x", "data: a", "data: b", "", "data: [DONE]", ""]
    assert list(sse_data(iter(lines))) == ["a\nb", "[DONE]"]


def test_endpoint_normalises_the_address_and_hides_the_key():
    endpoint = Endpoint("http://host:8000/v1/", api_key="sk-secret")
    assert endpoint.root == "http://host:8000" and endpoint.api_url == "http://host:8000/v1"
    assert "sk-secret" not in repr(endpoint)
    assert endpoint.request_headers()["Authorization"] == "Bearer sk-secret"
    with pytest.raises(ValueError, match="not an http"):
        Endpoint("ftp://host")
    with pytest.raises(ValueError, match="line break"):
        Endpoint("http://host", headers=(("X-A", "1\r\nInjected: yes"),))


def test_chat_request_is_the_servers_own_schema():
    body = chat_request("m", [{"role": "user", "content": "Hi"}], 5, {"temperature": 0.0, "seed": 3, "bogus": 1})
    assert body == {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5,
                    "temperature": 0.0, "seed": 3, "stream": True, "stream_options": {"include_usage": True}}
    with pytest.raises(ValueError):
        chat_request("m", [], 5)


def test_remote_refs_round_trip():
    ref = remote_ref("lab", "org/model:7b")
    assert ref == "remote://lab/org/model:7b" and parse_remote_ref(ref) == ("lab", "org/model:7b")
    with pytest.raises(ValueError):
        parse_remote_ref("/models/x.gguf")


def test_a_good_stream_gives_text_and_figures_from_the_wire(fake_server: FakeServer):
    model = RemoteModel(Endpoint(fake_server.url("ok")), "fake")
    text, last = run(model)
    assert text == "Hello, partial world!"
    assert last.finish_reason == "stop"
    assert last.generated_tokens == 5 and last.prompt_tokens == 7  # the server's usage
    assert last.prefill_s > 0 and last.decode_s >= 0
    assert RemoteClient(Endpoint(fake_server.url("ok"))).list_models() == ["fake", "fake-2"]
    stats = model.scheduler.stats()
    assert stats.requests == 1 and stats.errors == 0 and stats.in_flight == 0 and stats.last_ttft_s > 0


@pytest.mark.parametrize("mode, error, words", [
    ("malformed", MalformedStream, "cannot read"),
    ("truncated", TruncatedStream, "closed the stream before the answer ended"),
    ("overloaded", ServerError, "503"),
])
def test_faults_give_their_own_message_and_keep_the_text(fake_server: FakeServer, mode, error, words):
    model = RemoteModel(Endpoint(fake_server.url(mode)), "fake")
    text, last = run(model)
    assert isinstance(last, RequestEvent) and last.kind == "failed"
    assert words in last.detail
    if mode != "overloaded":
        assert text.startswith("Hello") and "The answer so far is kept." in last.detail
    assert model.scheduler.stats().errors == 1
    with pytest.raises(error):
        list(RemoteClient(Endpoint(fake_server.url(mode))).stream_chat("fake", [{"role": "user", "content": "x"}], 8))


def test_a_stall_ends_at_the_stall_timeout_not_after_30_s(fake_server: FakeServer):
    model = RemoteModel(Endpoint(fake_server.url("stall"), stall_timeout_s=1.0), "fake")
    started = time.monotonic()
    text, last = run(model)
    assert time.monotonic() - started < 10
    assert text == "Hello, partial"
    assert last.kind == "failed" and "sent nothing for 1 s" in last.detail and "kept" in last.detail


def test_wrong_key_and_missing_model(fake_server: FakeServer):
    client = RemoteClient(Endpoint(fake_server.url("auth"), api_key="sk-wrong"))
    with pytest.raises(AuthenticationFailed, match="refused the API key"):
        list(client.stream_chat("fake", [{"role": "user", "content": "x"}], 8))
    assert run(RemoteModel(Endpoint(fake_server.url("auth"), api_key=KEY), "fake"))[0] == "Hello, partial world!"
    with pytest.raises(ModelNotFound, match="404"):
        list(RemoteClient(Endpoint(fake_server.url("ok"))).stream_chat("missing", [{"role": "user", "content": "x"}],
                                                                         8))


def test_429_is_retried_after_retry_after(fake_server: FakeServer):
    waits = []
    client = RemoteClient(Endpoint(fake_server.url("busy")), sleep=lambda s, cancel: waits.append(s) or False)
    chunks = list(client.stream_chat("fake", [{"role": "user", "content": "x"}], 8))
    assert waits == [1.0]
    assert "".join(c.text for c in chunks) == "Hello, partial world!"
    assert fake_server.stats()["busy_calls"] == 2
    none = RemoteClient(Endpoint(fake_server.url("busy"), max_retries=0))
    with pytest.raises(RateLimited, match="429") as info:
        list(none.stream_chat("fake", [{"role": "user", "content": "x"}], 8))
    assert info.value.retry_after_s == 1.0


def test_stop_closes_the_stream_and_the_server_sees_it(fake_server: FakeServer):
    model = RemoteModel(Endpoint(fake_server.url("slow")), "fake")
    text, last = run(model, stop_after_chars=6)
    assert last.kind == "cancelled" and text
    deadline = time.monotonic() + 10
    while fake_server.stats()["disconnected"] < 1:
        assert time.monotonic() < deadline, "the server never saw the disconnect"
        time.sleep(0.1)
    assert model.scheduler.stats().in_flight == 0


def test_killed_mid_stream_then_the_endpoint_comes_back(fake_server: FakeServer):
    model = RemoteModel(Endpoint(fake_server.url("die")), "fake")
    cancel = threading.Event()
    _, handle = model.start_chat([{"role": "user", "content": "Hi"}], SamplingParams(), 500, cancel=cancel)
    text, last = "", None
    while last is None:
        model.scheduler.step()
        for event in handle.ready():
            if isinstance(event, RequestEvent):
                last = event
            else:
                text += event.text
        if len(text) > 20 and fake_server.process.poll() is None:
            fake_server.kill()
    assert last.kind == "failed" and "broke mid-answer" in last.detail and "kept" in last.detail
    assert len(text) > 20
    with pytest.raises(EndpointUnreachable, match="Cannot reach"):
        RemoteClient(Endpoint(fake_server.url("ok"))).list_models()
    again = RemoteModel(Endpoint(fake_server.url("ok")), "fake")
    _, failed = run(again)
    assert failed.kind == "failed" and "Cannot reach" in failed.detail
    fake_server.start()  # back on the same port: the same model object answers again
    assert run(again)[0] == "Hello, partial world!"


def test_the_cli_streams_and_reports_failures(fake_server: FakeServer, capsys, monkeypatch):
    monkeypatch.setenv("FAKE_KEY", KEY)
    assert main(["generate", "fake", "--remote", fake_server.url("auth"), "--api-key-env", "FAKE_KEY", "--prompt",
                 "Hi", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["text"] == "Hello, partial world!" and out["generated_tokens"] == 5 and out["finish_reason"] == "stop"
    assert main(["generate", "fake", "--remote", fake_server.url("truncated"), "--chat", "Hi"]) == 1
    captured = capsys.readouterr()
    assert captured.out.startswith("Hello, partial") and "closed the stream before the answer ended" in captured.err
    assert main(["generate", "fake", "--remote", fake_server.url("ok"), "--api-key-env", "NOT_SET_ANYWHERE",
                 "--prompt", "Hi"]) == 2
    assert "NOT_SET_ANYWHERE" in capsys.readouterr().err


class StoppedMidWait:
    """A client whose stream gives one chunk, then sees Stop pressed while the scheduler waits, and ends."""

    def stream_chat(self, model, messages, max_tokens, sampling, cancel, on_open=None):
        yield StreamChunk("Hello")
        time.sleep(0.2)  # the scheduler's next step is waiting on the wire by now
        cancel.set()


def test_stop_pressed_while_a_step_waits_ends_cancelled_not_complete():
    scheduler = RemoteScheduler(StoppedMidWait(), "m")
    handle = scheduler.submit([{"role": "user", "content": "Hi"}], 8, {}, threading.Event())
    scheduler.step(wait_s=5)
    assert [e.text for e in handle.ready()] == ["Hello"]
    scheduler.step(wait_s=5)
    events = list(handle.ready())
    assert len(events) == 1 and isinstance(events[0], RequestEvent) and events[0].kind == "cancelled"


def test_thinking_sent_apart_is_written_between_think_tags(fake_server: FakeServer):
    model = RemoteModel(Endpoint(fake_server.url("thinking")), "fake")
    text, last = run(model)
    assert text == "<think>The user greets.</think>Hello!" and last.finish_reason == "stop"
    assert model.reasoning.syntax == "think"
