"""DownloadManager against the fake Hub: every fault, pause/resume/cancel, restarts, disk space, unsafe names."""

from __future__ import annotations

import collections
import hashlib

import pytest

from app.models import downloads
from app.models.downloads import DownloadError, DownloadManager
from app.models.hub import HubClient
from app.models.library import ModelLibrary
from tests.app.models.conftest import FILE, REPO
from tests.app.models.tiny_gguf import write_tiny_gguf
from tests.model_store import model_path

KEY = f"{REPO}/{FILE}"


def library_names(data_dir) -> list[str]:
    return [e.name for e in ModelLibrary(data_dir, scan_dirs=[], builtin=None).list()]


def leftovers(manager: DownloadManager) -> list[str]:
    return sorted(p.suffix for p in manager.downloads_dir.glob("*") if p.suffix != ".lock")


def ranges(hub) -> list[str | None]:
    """The Range header of each file request Hearth made (a redirect's second hop repeats it, so is left out)."""
    return [r.headers.get("range") for r in hub.file_requests() if "/resolve/" in r.path]


def pause_at(manager: DownloadManager, n_bytes: int):
    """A progress callback that pauses the download once, when ``n_bytes`` have arrived (on the worker thread)."""
    done = []
    def callback(p):
        if p.state == "running" and p.downloaded >= n_bytes and not done:
            done.append(p.downloaded)
            manager.pause(p.key)
    return callback


def test_download_lands_verified_in_the_library(hub, make_manager, tiny_model):
    manager = make_manager()
    events = []
    key = manager.start(REPO, FILE, on_progress=events.append)
    done = manager.wait(key, timeout=30)
    assert (done.state, done.downloaded, done.total, done.error) == ("completed", len(tiny_model), len(tiny_model), None)
    assert done.path == manager.models_dir / "acme" / "Tiny-GGUF" / FILE
    assert done.path.read_bytes() == tiny_model
    assert library_names(manager.data_dir) == [KEY]
    assert leftovers(manager) == []
    states = [e.state for e in events]
    assert states[0] == "running" and states[-2:] == ["verifying", "completed"]
    flowing = [e for e in events if e.state == "running" and e.downloaded > 0]
    assert flowing and all(e.bytes_per_second > 0 and e.eta_seconds is not None for e in flowing)
    assert [e.downloaded for e in flowing] == sorted(e.downloaded for e in flowing)
    with pytest.raises(DownloadError, match="already downloaded"):
        manager.start(REPO, FILE)


def test_token_goes_to_the_hub_but_not_to_a_cdn_on_another_origin(hub, make_manager, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", hub.token)
    hub.redirect = "cross-origin"
    manager = make_manager()
    assert manager.wait(manager.start(REPO, FILE), timeout=30).state == "completed"
    resolve, cdn = hub.file_requests()
    assert resolve.path.startswith(f"/{REPO}/resolve/main/") and resolve.headers["authorization"] == f"Bearer {hub.token}"
    assert cdn.path.startswith("/cdn/") and "authorization" not in cdn.headers


def test_connection_cuts_are_resumed_with_range_requests(hub, make_manager, tiny_model):
    hub.faults.cuts = [1 << 20, 1 << 20]
    manager = make_manager()
    done = manager.wait(manager.start(REPO, FILE), timeout=30)
    assert done.state == "completed" and done.path.read_bytes() == tiny_model
    assert ranges(hub) == [None, f"bytes={1 << 20}-", f"bytes={2 << 20}-"]


def test_a_connection_that_keeps_dropping_fails_clearly_and_resumes_later(hub, make_manager, tiny_model):
    hub.faults.cuts = [1 << 20] + [0] * 10
    manager = make_manager()
    failed = manager.wait(manager.start(REPO, FILE), timeout=30)
    assert failed.state == "failed"
    assert "the connection was lost" in failed.error and "resume to continue" in failed.error
    assert failed.downloaded == 1 << 20 and library_names(manager.data_dir) == []
    hub.faults.cuts = []
    manager.resume(KEY)
    done = manager.wait(KEY, timeout=30)
    assert done.state == "completed" and done.path.read_bytes() == tiny_model
    assert ranges(hub)[-1] == f"bytes={1 << 20}-"


def test_wrong_body_is_caught_by_sha256_and_deleted(hub, make_manager):
    hub.faults.wrong_body = True
    manager = make_manager()
    failed = manager.wait(manager.start(REPO, FILE), timeout=30)
    assert failed.state == "failed"
    assert "arrived corrupt: its sha256 is" in failed.error and "it was deleted" in failed.error
    assert library_names(manager.data_dir) == [] and leftovers(manager) == []


def test_wrong_body_of_a_file_without_sha256_is_caught_by_the_gguf_check(hub, make_manager, tiny_model):
    hub.add_file(REPO, "plain.gguf", tiny_model, lfs=False)
    hub.faults.wrong_body = True
    manager = make_manager()
    failed = manager.wait(manager.start(REPO, "plain.gguf"), timeout=30)
    assert failed.state == "failed" and "it is not a valid GGUF file (not a GGUF file" in failed.error
    assert library_names(manager.data_dir) == [] and leftovers(manager) == []


def test_short_body_fails_without_reaching_the_library(hub, make_manager, tiny_model):
    hub.faults.short_body = 1000
    manager = make_manager()
    failed = manager.wait(manager.start(REPO, FILE), timeout=30)
    assert failed.state == "failed"
    assert f"its file is shorter than the {len(tiny_model)} bytes the Hub lists" in failed.error
    assert library_names(manager.data_dir) == []


@pytest.mark.parametrize("status, message", [
    (404, "was not found on the Hub (404)"),
    (401, "needs permission (401): it is gated or private — accept its terms on the Hub and set HF_TOKEN"),
    (500, "the server answered 500; 0.0 MB of {size:.1f} MB kept, resume to continue"),
])
def test_http_errors_fail_with_clear_messages(hub, make_manager, tiny_model, status, message):
    message = message.format(size=len(tiny_model) / 1e6)
    hub.faults.status = status
    manager = make_manager()
    failed = manager.wait(manager.start(REPO, FILE), timeout=30)
    assert failed.state == "failed" and message in failed.error
    assert library_names(manager.data_dir) == []
    expected_requests = 3 if status == 500 else 1  # a server error is retried (max_retries=2)
    assert len(hub.file_requests()) == expected_requests


def test_gated_repository_without_token_is_refused_at_start(hub, make_manager, tiny_model, monkeypatch):
    hub.add_file("secret/Gated-GGUF", "g.gguf", tiny_model, gated=True)
    manager = make_manager()
    with pytest.raises(DownloadError, match="gated: accept its terms on the Hub, then set HF_TOKEN"):
        manager.start("secret/Gated-GGUF", "g.gguf")
    monkeypatch.setenv("HF_TOKEN", hub.token)
    assert manager.wait(manager.start("secret/Gated-GGUF", "g.gguf"), timeout=30).state == "completed"


def test_missing_file_is_refused_at_start(hub, make_manager):
    with pytest.raises(DownloadError, match="has no file 'nope.gguf'"):
        make_manager().start(REPO, "nope.gguf")


def test_pause_keeps_the_partial_file_and_resume_continues_it(hub, make_manager, tiny_model):
    manager = make_manager()
    paused = manager.wait(manager.start(REPO, FILE, on_progress=pause_at(manager, 1 << 20)), timeout=30)
    assert paused.state == "paused" and (1 << 20) <= paused.downloaded < len(tiny_model)
    assert leftovers(manager) == [".json", ".part"] and library_names(manager.data_dir) == []
    manager.resume(KEY)
    done = manager.wait(KEY, timeout=30)
    assert done.state == "completed" and done.path.read_bytes() == tiny_model
    assert ranges(hub) == [None, f"bytes={paused.downloaded}-"]


def test_resume_after_restart_uses_the_saved_state(hub, make_manager, tiny_model):
    first = make_manager()
    paused = first.wait(first.start(REPO, FILE, on_progress=pause_at(first, 1 << 20)), timeout=30)
    second = make_manager()  # a new process on the same data folder
    (saved,) = second.list()
    assert (saved.key, saved.state, saved.downloaded, saved.total) == (KEY, "paused", paused.downloaded, len(tiny_model))
    second.start(REPO, FILE)  # starting again resumes
    done = second.wait(KEY, timeout=30)
    assert done.state == "completed" and done.path.read_bytes() == tiny_model
    assert ranges(hub) == [None, f"bytes={paused.downloaded}-"]


@pytest.mark.parametrize("damage", [lambda b: b[: len(b) // 2], lambda b: b"\x00\xff" + b[2:]], ids=["truncated", "corrupt"])
def test_a_damaged_state_file_is_moved_aside_with_a_notice_and_nothing_else_is_lost(hub, make_manager, tiny_model,
                                                                                      tmp_path, damage):
    first = make_manager()
    first.wait(first.start(REPO, FILE, on_progress=pause_at(first, 1 << 20)), timeout=30)
    (state_file,) = (tmp_path / "data" / "downloads").glob("*.json")
    part = state_file.with_suffix(".part")
    part_bytes, damaged = part.read_bytes(), damage(state_file.read_bytes())
    state_file.write_bytes(damaged)
    second = make_manager()  # a new process: it starts despite the damage
    (moved,) = (tmp_path / "data" / "downloads").glob("*.json.damaged-*")
    assert second.list() == [] and not state_file.exists() and moved.read_bytes() == damaged
    assert len(second.notices) == 1 and str(moved) in second.notices[0] and "damaged" in second.notices[0]
    assert part.read_bytes() == part_bytes  # the bytes downloaded so far are kept
    done = second.wait(second.start(REPO, FILE), timeout=30)
    assert done.state == "completed" and done.path.read_bytes() == tiny_model


def test_a_server_that_ignores_range_makes_the_download_restart_from_zero(hub, make_manager, tiny_model):
    manager = make_manager()
    paused = manager.wait(manager.start(REPO, FILE, on_progress=pause_at(manager, 1 << 20)), timeout=30)
    hub.faults.ignore_range = True
    manager.resume(KEY)
    done = manager.wait(KEY, timeout=30)
    assert done.state == "completed" and done.path.read_bytes() == tiny_model
    assert ranges(hub) == [None, f"bytes={paused.downloaded}-"]  # asked for the rest, got and used the whole file


def test_a_changed_etag_restarts_from_zero_with_the_new_file(hub, make_manager, tmp_path):
    manager = make_manager()
    paused = manager.wait(manager.start(REPO, FILE, on_progress=pause_at(manager, 1 << 20)), timeout=30)
    new_version = write_tiny_gguf(tmp_path / "v2.gguf", name="Tiny v2", extra_bytes=2 << 20, seed=7).read_bytes()
    hub.add_file(REPO, FILE, new_version)
    manager.resume(KEY)
    done = manager.wait(KEY, timeout=30)
    assert done.state == "completed" and done.path.read_bytes() == new_version
    assert ranges(hub) == [None, f"bytes={paused.downloaded}-", None]  # the 206 had a new ETag: ask again from 0


def test_a_changed_etag_with_the_same_content_still_restarts_cleanly(hub, make_manager, tiny_model):
    manager = make_manager()
    paused = manager.wait(manager.start(REPO, FILE, on_progress=pause_at(manager, 1 << 20)), timeout=30)
    hub.faults.etag_salt = "-v2"
    manager.resume(KEY)
    done = manager.wait(KEY, timeout=30)
    assert done.state == "completed" and done.path.read_bytes() == tiny_model
    assert ranges(hub) == [None, f"bytes={paused.downloaded}-", None]


def test_cancel_deletes_the_partial_file(hub, make_manager):
    manager = make_manager()
    manager.wait(manager.start(REPO, FILE, on_progress=pause_at(manager, 1 << 20)), timeout=30)
    manager.cancel(KEY)
    assert manager.status(KEY).state == "cancelled"
    assert leftovers(manager) == [] and library_names(manager.data_dir) == []


def test_cancel_while_running_stops_and_deletes(hub, make_manager):
    manager = make_manager()
    def cancel_at_1mib(p):
        if p.state == "running" and p.downloaded >= 1 << 20:
            manager.cancel(p.key)
    done = manager.wait(manager.start(REPO, FILE, on_progress=cancel_at_1mib), timeout=30)
    assert done.state == "cancelled"
    assert leftovers(manager) == [] and library_names(manager.data_dir) == []


def test_not_enough_disk_space_is_refused_before_starting(hub, make_manager, monkeypatch):
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(downloads.shutil, "disk_usage", lambda path: usage(10 << 30, 10 << 30, 5 << 20))
    manager = make_manager()
    with pytest.raises(DownloadError, match=r"not enough disk space for acme/Tiny-GGUF/tiny-q8_0.gguf: it needs 3.2 MB more"):
        manager.start(REPO, FILE)
    assert hub.file_requests() == [] and leftovers(manager) == []


@pytest.mark.parametrize("repo, filename", [
    (REPO, "../../evil.gguf"), (REPO, "/etc/evil.gguf"), (REPO, "sub/../../../evil.gguf"), (REPO, "C:\\evil.gguf"),
    (REPO, "sub//evil.gguf"), ("../acme", FILE), ("acme/..", FILE), ("acme", FILE), (REPO, "notes.txt"),
])
def test_unsafe_names_are_refused(hub, make_manager, repo, filename):
    with pytest.raises(DownloadError, match="refusing"):
        make_manager().start(repo, filename)
    assert hub.requests == []


def test_files_in_subfolders_of_a_repo_are_allowed(hub, make_manager, tiny_model):
    hub.add_file(REPO, "Q8_0/tiny-part.gguf", tiny_model)
    manager = make_manager()
    done = manager.wait(manager.start(REPO, "Q8_0/tiny-part.gguf"), timeout=30)
    assert done.state == "completed" and done.path == manager.models_dir / "acme" / "Tiny-GGUF" / "Q8_0" / "tiny-part.gguf"


def test_starting_the_same_file_twice_joins_the_running_download(hub, make_manager):
    manager = make_manager()
    joined, seen = [], []
    def start_again(p):
        if p.state == "running" and p.downloaded > 0 and not joined:
            joined.append(manager.start(REPO, FILE, on_progress=seen.append))
    key = manager.start(REPO, FILE, on_progress=start_again)
    assert manager.wait(key, timeout=30).state == "completed"
    assert joined == [key] and seen[-1].state == "completed"
    assert len(hub.file_requests()) == 1


def test_another_process_downloading_the_same_file_is_refused(hub, make_manager):
    first, second = make_manager(), make_manager()
    errors = []
    def start_elsewhere(p):
        if p.state == "running" and p.downloaded > 0 and not errors:
            try:
                second.start(REPO, FILE)
            except DownloadError as e:
                errors.append(str(e))
    assert first.wait(first.start(REPO, FILE, on_progress=start_elsewhere), timeout=30).state == "completed"
    assert errors == [f"{KEY} is already being downloaded by another Hearth window or process"]


@pytest.mark.slow
def test_real_model_downloads_with_cuts_and_matches_its_sha256(hub, make_manager):
    path = model_path("smollm2")
    hub.add_file("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", path.name, path)
    hub.faults.cuts = [40 << 20]
    hub.redirect = "same-origin"
    manager = make_manager()
    done = manager.wait(manager.start("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", path.name), timeout=120)
    assert done.state == "completed"
    assert hashlib.sha256(done.path.read_bytes()).hexdigest() == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert ranges(hub) == [None, f"bytes={40 << 20}-"]


def test_a_download_finished_by_another_process_is_not_fetched_again(hub, make_manager):
    first = make_manager()
    first.wait(first.start(REPO, FILE, on_progress=pause_at(first, 1 << 20)), timeout=30)
    second = make_manager()  # read the paused state
    first.resume(KEY)
    assert first.wait(KEY, timeout=30).state == "completed"
    with pytest.raises(DownloadError, match="already downloaded"):
        second.resume(KEY)
    assert len(ranges(hub)) == 2
