"""The verdict of a Hub file from its header alone, read with Range requests from the fake Hub."""

from __future__ import annotations

import re

import pytest
from huggingface_hub import constants

from app.model_fit import HeaderUnavailable, fetch_header, judged_estimate, local_estimate, remote_estimate
from app.models.hub import HubClient
from engine.gguf_file import read_gguf
from engine.ggml_types import GGMLQuantizationType
from tests.app.models.fake_hub import FakeHub
from tests.engine.header_builders import header_bytes, model_header, write_model_file

REPO = "acme/Synthetic-GGUF"
AVAILABLE = 1 << 40


@pytest.fixture(autouse=True)
def no_real_hub_credentials(monkeypatch, tmp_path):
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-saved-token"))


@pytest.fixture
def hub(monkeypatch):
    with FakeHub() as fake:
        monkeypatch.setenv("HF_ENDPOINT", fake.url)
        yield fake


def serve(hub, tmp_path, name, header):
    path = write_model_file(tmp_path / name, header)
    hub.add_file(REPO, name, path)
    return path, HubClient().file_url(REPO, name)


def rwkv7_header():
    header = model_header("llama", n_embd=512, n_ff=1024)
    header.metadata = {k.replace("llama.", "rwkv7."): v for k, v in header.metadata.items()}
    header.metadata["general.architecture"] = "rwkv7"
    return header


@pytest.mark.parametrize("name, header", [
    ("llama.gguf", model_header("llama", n_embd=512, n_ff=1024)),
    ("gemma3-q4_k.gguf", model_header("gemma3", n_embd=512, n_ff=1024, qtype=GGMLQuantizationType.Q4_K)),
    ("rwkv7.gguf", rwkv7_header()),
    ("llama-q8_1.gguf", model_header("llama", n_embd=512, n_ff=1024).with_types(GGMLQuantizationType.Q8_1)),
])
def test_the_remote_verdict_is_the_local_one_from_a_few_ranged_bytes(hub, tmp_path, name, header):
    path, url = serve(hub, tmp_path, name, header)
    remote = remote_estimate(url, path.stat().st_size, 2048, available=AVAILABLE)
    with read_gguf(path) as g:
        local = judged_estimate(g, g.file_size, 2048, available=AVAILABLE)
    assert remote == local and remote.runs is not None
    assert all(re.fullmatch(r"bytes=\d+-\d+", r or "") for r in hub.ranges(name))  # never the whole file
    assert hub.bytes_asked(name) < path.stat().st_size


def test_a_header_longer_than_the_first_read_is_read_on_in_doubling_ranges(hub, tmp_path):
    path, url = serve(hub, tmp_path, "llama.gguf", model_header("llama", n_embd=512, n_ff=1024))
    data, size = header_bytes(model_header("llama", n_embd=512, n_ff=1024))
    header = fetch_header(url, size, first=1024)
    assert len(header.tensors) == 21 and header.data_offset >= len(data)
    ranges = [tuple(map(int, re.fullmatch(r"bytes=(\d+)-(\d+)", r).groups())) for r in hub.ranges("llama.gguf")]
    assert ranges[0] == (0, 1023) and len(ranges) >= 3
    for (a0, a1), (b0, b1) in zip(ranges, ranges[1:]):
        assert b0 == a1 + 1 and b1 + 1 >= 2 * b0  # contiguous, each read at least doubles what is held
    assert ranges[-1][1] < 4 * len(data)


def test_a_header_longer_than_the_cap_is_not_judged(hub, tmp_path):
    path, url = serve(hub, tmp_path, "llama.gguf", model_header("llama", n_embd=512, n_ff=1024))
    with pytest.raises(HeaderUnavailable, match="the GGUF header is longer than the 0.0 MB read"):
        fetch_header(url, path.stat().st_size, first=1024, cap=2048)
    assert hub.bytes_asked("llama.gguf") == 2048


def test_a_server_that_ignores_range_is_read_only_as_far_as_the_header(hub, tmp_path):
    path, url = serve(hub, tmp_path, "llama.gguf", model_header("llama", n_embd=512, n_ff=1024))
    hub.faults.ignore_range = True
    estimate = remote_estimate(url, path.stat().st_size, 2048, available=AVAILABLE)
    assert estimate.runs is True and not estimate.rough


def test_an_unreachable_header_gives_an_unknown_verdict_with_a_rough_estimate(hub, tmp_path):
    path, url = serve(hub, tmp_path, "llama.gguf", model_header("llama"))
    hub.faults.status = 404
    estimate = remote_estimate(url, path.stat().st_size, 2048, available=AVAILABLE)
    assert estimate.runs is None and estimate.rough and estimate.reasons == ("the Hub answered 404 when the header was read",)
    assert estimate.summary().startswith("Not checked (the Hub answered 404")


def test_a_malformed_file_will_not_load(hub, tmp_path):
    hub.add_file(REPO, "junk.gguf", b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 400)
    estimate = remote_estimate(HubClient().file_url(REPO, "junk.gguf"), 408, 2048, available=AVAILABLE)
    assert estimate.runs is False and estimate.reasons[0].startswith("not a valid GGUF model: metadata count")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model")
    assert local_estimate(str(junk), 2048, available=AVAILABLE).summary() == \
        "Won't load: not a valid GGUF model: file is too small to be GGUF (11 bytes)"


def test_the_summary_says_runs_here_and_what_it_needs(tmp_path):
    path = write_model_file(tmp_path / "m.gguf", model_header("llama"))
    fits = local_estimate(str(path), 2048, available=AVAILABLE)
    assert fits.runs and fits.summary() == f"Runs here · needs {fits.total / 1e6:.0f} MB"  # 10 to 100 MB
    tight = local_estimate(str(path), 2048, available=fits.total)
    assert tight.summary().startswith("Runs here, tight · needs ")
    assert local_estimate(str(path), 2048, available=fits.total // 2).summary().startswith("Won't fit · needs ")
