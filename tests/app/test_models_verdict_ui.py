"""The verdict on the Models page: every Hub file judged from its header before any download, per architecture and
type; a file that won't load is downloaded only after the user confirms; a local import that won't load says why."""

from __future__ import annotations

import html
import os
import re
from pathlib import Path

import pytest
from huggingface_hub import constants
from PySide6.QtCore import Qt

from app.model_fit import judged_estimate
from app.ui.downloads_panel import VERDICT_ROLE
from engine.config import SUPPORTED_ARCHITECTURES
from engine.ggml_types import GGMLQuantizationType
from engine.gguf_file import read_gguf
from tests.app.models.fake_hub import FakeHub
from tests.engine.header_builders import LAYER_TENSORS, model_header, write_model_file

from .fake_engine import FakeFactory

pytestmark = pytest.mark.gui

REPO = "acme/Every-Arch-GGUF"
WAIT = 30000
Q = GGMLQuantizationType
SCREENSHOT = os.environ.get("HEARTH_VERDICT_SCREENSHOT")  # where to save the page's picture, if anywhere


def rwkv7_header():
    header = model_header("llama", n_embd=512, n_ff=1024)
    header.metadata = {k.replace("llama.", "rwkv7."): v for k, v in header.metadata.items()}
    header.metadata["general.architecture"] = "rwkv7"
    return header


def hub_files() -> dict[str, object]:
    """A file per architecture (Q8_0), a supported one in each of several types, and files that cannot run."""
    files = {f"{arch}-q8_0.gguf": model_header(arch, n_embd=512, n_ff=1024) for arch in sorted(LAYER_TENSORS)}
    for qtype in (Q.Q4_K, Q.Q6_K, Q.F16, Q.IQ2_XS, Q.Q8_1):
        files[f"llama-{qtype.name.lower()}.gguf"] = model_header("llama", n_embd=512, n_ff=1024, qtype=qtype)
    files["rwkv7-q8_0.gguf"] = rwkv7_header()
    files["qwen2-no-k-bias.gguf"] = model_header("qwen2", n_embd=512, n_ff=1024).drop("blk.1.attn_k.bias")
    return files


@pytest.fixture(autouse=True)
def no_real_hub_credentials(monkeypatch, tmp_path):
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-saved-token"))


@pytest.fixture(scope="module")
def model_files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hub-files")
    return {name: write_model_file(root / name, header) for name, header in hub_files().items()}


@pytest.fixture
def hub(model_files, monkeypatch):
    with FakeHub() as fake:
        for name, path in model_files.items():
            fake.add_file(REPO, name, path, downloads=5)
        monkeypatch.setenv("HF_ENDPOINT", fake.url)
        yield fake


@pytest.fixture
def session(qtbot, hub, make_session):
    session = make_session(engine_factory=FakeFactory())
    session.window.show_page("models")
    return session


def list_repo(qtbot, session):
    panel, bridge = session.window.downloads_panel, session.downloads
    panel.search.setText("every-arch")
    with qtbot.waitSignal(bridge.search_results, timeout=WAIT):
        qtbot.keyClick(panel.search, Qt.Key.Key_Return)
    with qtbot.waitSignal(bridge.files_listed, timeout=WAIT):
        panel.repos.setCurrentRow(0)
    qtbot.waitUntil(lambda: all(i.data(0, VERDICT_ROLE) for i in panel.file_items()), timeout=WAIT)
    return panel, {item.text(0): item for item in panel.file_items()}


def select(panel, rows, name):
    panel.files.setCurrentItem(rows[name])
    return rows[name]


def test_every_hub_file_is_judged_from_its_header_before_any_download(qtbot, session, hub, model_files):
    panel, rows = list_repo(qtbot, session)
    assert sorted(rows) == sorted(model_files)
    for name, path in model_files.items():
        shown = rows[name].data(0, VERDICT_ROLE)
        with read_gguf(path) as g:
            expected = judged_estimate(g, g.file_size, panel.n_ctx(), available=shown["available"])
        assert (shown["runs"], shown["reasons"], shown["total"]) == (expected.runs, list(expected.reasons),
                                                                   expected.total), name
        assert rows[name].text(2) == expected.summary()
        # only the header was asked for, in closed ranges: never the whole file, never "from here to the end"
        assert all(re.fullmatch(r"bytes=\d+-\d+", r or "") for r in hub.ranges(name)), hub.ranges(name)
        assert hub.bytes_asked(name) < path.stat().st_size
    for arch in LAYER_TENSORS:
        text = rows[f"{arch}-q8_0.gguf"].text(2)
        assert text.startswith("Runs here · needs ") if arch in SUPPORTED_ARCHITECTURES else \
            text.startswith(f"Won't load: unsupported architecture '{arch}'")
    assert rows["rwkv7-q8_0.gguf"].text(2).startswith("Won't load: unsupported architecture 'rwkv7' (supported: ")
    assert rows["llama-q8_1.gguf"].text(2) == "Won't load: tensor type Q8_1 (16 tensors) has no CPU kernel"
    assert rows["qwen2-no-k-bias.gguf"].text(2) == \
        "Won't load: the model has no tensor 'blk.1.attn_k.bias', which qwen2 needs"
    for name in ("llama-q4_k.gguf", "llama-q6_k.gguf", "llama-f16.gguf"):
        assert rows[name].text(2).startswith("Runs here · needs "), name
    if SCREENSHOT:
        session.window.resize(1200, 900)
        qtbot.waitExposed(session.window)
        assert session.window.grab().save(SCREENSHOT)


def test_a_file_that_cannot_run_is_downloaded_only_after_the_user_confirms(qtbot, session, hub, model_files):
    panel, rows = list_repo(qtbot, session)
    name = "rwkv7-q8_0.gguf"
    select(panel, rows, name)
    assert panel.download_button.text() == "Download anyway…"
    asked = []
    panel.confirm = lambda title, text: asked.append(text) or False
    qtbot.mouseClick(panel.download_button, Qt.MouseButton.LeftButton)
    assert len(asked) == 1 and asked[0].startswith(f"{name} won't load here: unsupported architecture 'rwkv7'")
    assert html.unescape(panel.message.text()) == f"Not downloaded: {name} won't load here."
    assert all(r is not None and r.endswith(tuple("0123456789")) for r in hub.ranges(name))  # header reads only
    assert f"{REPO}/{name}" not in panel.rows
    panel.confirm = lambda title, text: True
    with qtbot.waitSignal(session.downloads.download_completed, timeout=WAIT) as done:
        qtbot.mouseClick(panel.download_button, Qt.MouseButton.LeftButton)
    assert Path(done.args[1]).read_bytes() == model_files[name].read_bytes()


def test_the_bridge_refuses_a_file_that_cannot_run_without_the_users_word(qtbot, session, hub):
    bridge = session.downloads
    name = "llama-q8_1.gguf"  # never listed in this session: judged from its header first
    with qtbot.waitSignal(bridge.failed, timeout=WAIT) as failed:
        bridge.start(REPO, name)
    assert failed.args == [f"{REPO}/{name}", "not downloaded: it won't load here (tensor type Q8_1 (16 tensors) "
                                             "has no CPU kernel); download it anyway to keep it"]
    assert all(re.fullmatch(r"bytes=\d+-\d+", r or "") for r in hub.ranges(name)) and hub.ranges(name)
    assert bridge.downloads() == []


def test_a_runnable_file_is_downloaded_without_a_question(qtbot, session, model_files):
    panel, rows = list_repo(qtbot, session)
    select(panel, rows, "llama-q4_k.gguf")
    panel.confirm = lambda title, text: pytest.fail("must not ask")
    with qtbot.waitSignal(session.downloads.download_completed, timeout=WAIT):
        qtbot.mouseClick(panel.download_button, Qt.MouseButton.LeftButton)


def test_a_local_import_that_cannot_run_shows_the_reason_on_its_row(qtbot, session, model_files, tmp_path):
    page = session.window.models_page
    bad = tmp_path / "mine" / "rwkv7-q8_0.gguf"
    bad.parent.mkdir()
    bad.write_bytes(model_files["rwkv7-q8_0.gguf"].read_bytes())
    good = bad.parent / "llama-q8_0.gguf"
    good.write_bytes(model_files["llama-q8_0.gguf"].read_bytes())
    for path in (bad, good):
        page.add_requested.emit(str(path))
    rows = {page.list.item(i).data(Qt.ItemDataRole.UserRole): page.list.item(i) for i in range(page.list.count())}
    text = rows[str(bad)].text()
    assert "\nWon't load: unsupported architecture 'rwkv7' (supported: " in text
    assert not rows[str(bad)].flags() & Qt.ItemFlag.ItemIsEnabled
    assert rows[str(bad)].foreground().color().name() == "#c5322a"  # greyed out, yet the reason stays readable
    assert "Runs here · needs " in rows[str(good)].text() and rows[str(good)].flags() & Qt.ItemFlag.ItemIsEnabled
    if SCREENSHOT:
        session.window.resize(1200, 900)
        qtbot.waitExposed(session.window)
        session.window.show_page("models")  # adding a model that runs switched to it, on the chat page
        assert session.window.grab().save(SCREENSHOT.replace(".png", "-import.png"))


def test_a_fault_judging_one_file_leaves_it_unchecked_and_judges_the_others(qtbot, session, monkeypatch):
    real = session.downloads._estimate

    def flaky(url, size, n_ctx, token):
        if url.endswith("/llama-f16.gguf"):
            raise RuntimeError("boom")
        return real(url, size, n_ctx, token)
    monkeypatch.setattr(session.downloads, "_estimate", flaky)
    panel, rows = list_repo(qtbot, session)
    assert rows["llama-f16.gguf"].text(2).startswith("Not checked (the file could not be judged: boom) · needs ≈ ")
    assert rows["llama-q8_0.gguf"].text(2).startswith("Runs here · needs ")


def test_a_row_s_colour_follows_its_verdict(qapp):
    """Red for a file that won't load or fit, amber for one that runs only from the OS page cache, plain otherwise."""
    from app.ui.downloads_panel import SLOW_COLOR, WONT_LOAD_COLOR, verdict_color

    assert verdict_color({"runs": False}).name() == WONT_LOAD_COLOR.lower()
    assert verdict_color({"runs": True, "verdict": "won't fit"}).name() == WONT_LOAD_COLOR.lower()
    assert verdict_color({"runs": True, "verdict": "paged"}).name() == SLOW_COLOR.lower()
    assert verdict_color({"runs": True, "verdict": "fits"}) is None
