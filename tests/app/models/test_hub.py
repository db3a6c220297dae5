"""HubClient against the fake Hub (HF_ENDPOINT, HF_TOKEN, errors) and the curated model list."""

from __future__ import annotations

import hashlib
import json
import socket

import pytest

from app.models.hub import CURATED_PATH, HubClient, HubError, HubFile, load_curated
from engine.config import SUPPORTED_ARCHITECTURES
from tests.app.models.conftest import FILE, REPO


def test_search_finds_gguf_repositories_through_hf_endpoint(hub, tiny_model):
    hub.add_file("other/Small-GGUF", "small.gguf", tiny_model, downloads=99)
    client = HubClient()  # endpoint from HF_ENDPOINT, set by the fixture
    assert client.endpoint == hub.url
    assert [m.repo for m in client.search("gguf")] == ["other/Small-GGUF", REPO]
    (found,) = client.search("tiny", limit=5)
    assert (found.repo, found.downloads, found.gated) == (REPO, 10, False)
    assert hub.requests[-1].query == {"search": ["tiny"], "filter": ["gguf"], "sort": ["downloads"], "limit": ["5"]}
    assert len(client.search("gguf", limit=1)) == 1


def test_list_gguf_files_gives_sizes_and_lfs_sha256(hub, tiny_model):
    hub.add_file(REPO, "small-f16.gguf", b"GGUF-not-lfs", lfs=False)
    files = HubClient().list_gguf_files(REPO)
    assert files == [
        ("small-f16.gguf", 12, None),
        (FILE, len(tiny_model), hashlib.sha256(tiny_model).hexdigest()),  # README.md is not a GGUF: left out
    ]
    assert isinstance(files[1], HubFile) and files[1].to_dict()["size"] == len(tiny_model)


def test_token_is_sent_when_set_and_opens_gated_repositories(hub, tiny_model, monkeypatch):
    hub.add_file("secret/Gated-GGUF", "g.gguf", tiny_model, gated=True)
    with pytest.raises(HubError, match="gated: accept its terms on the Hub, then set HF_TOKEN"):
        HubClient().list_gguf_files("secret/Gated-GGUF")
    monkeypatch.setenv("HF_TOKEN", hub.token)
    assert [f.filename for f in HubClient().list_gguf_files("secret/Gated-GGUF")] == ["g.gguf"]
    assert hub.requests[-1].headers["authorization"] == f"Bearer {hub.token}"


@pytest.mark.parametrize("repo, message", [
    ("acme/Missing-GGUF", "acme/Missing-GGUF was not found on http://127.0.0.1:"),
    ("not a repo", "'not a repo' is not a valid repository name"),
])
def test_errors_are_explained(hub, repo, message):
    with pytest.raises(HubError, match=message):
        HubClient().list_gguf_files(repo)


def test_file_info_names_a_missing_file(hub):
    with pytest.raises(HubError, match="has no file 'absent.gguf'"):
        HubClient().file_info(REPO, "absent.gguf")


def test_unreachable_hub_is_reported(monkeypatch):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(HubError, match=f"cannot reach http://127.0.0.1:{port}"):
        HubClient(endpoint=f"http://127.0.0.1:{port}").list_gguf_files(REPO)


def test_curated_list_names_runnable_gguf_files():
    curated = load_curated()
    assert len(curated) >= 5
    assert len({c.repo for c in curated}) == len(curated)
    for c in curated:
        assert c.repo.count("/") == 1 and c.filename.endswith(".gguf")
        assert c.architecture in SUPPORTED_ARCHITECTURES
        assert c.title and c.description and c.license


def test_a_broken_curated_file_raises_a_clear_error(tmp_path):
    bad = tmp_path / "curated.json"
    bad.write_text(json.dumps({"models": [{"repo": "a/b"}]}))
    with pytest.raises(HubError, match="curated model list .* is unreadable"):
        load_curated(bad)
    assert CURATED_PATH.name == "curated_models.json"
