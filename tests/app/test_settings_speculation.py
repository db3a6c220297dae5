"""Speculative decoding settings: stored and clamped, kept out of exports, edited in the panel, drafts filtered;
the figures under an answer."""

import dataclasses
import json
from pathlib import Path

import pytest

from app.chat_settings import MAX_DRAFT_LIMIT, ChatSettings
from app.conversation_export import conversation_document, parse_document
from app.draft_models import DraftCompatibility
from app.model_choices import ModelChoice
from app.store import ConversationStore, Message
from app.ui.message_widget import stats_details, stats_text
from app.ui.settings_panel import SettingsPanel
from tests.model_store import model_path

from .fake_engine import FakeFactory, FakeModel


def test_speculation_settings_round_trip_through_json():
    settings = ChatSettings(speculation="draft", draft_model="/models/small.gguf", max_draft=5)
    again = ChatSettings.from_dict(json.loads(json.dumps(settings.to_dict())))
    assert again == settings
    assert again.speculation_options() == {"mode": "draft", "draft_model": "/models/small.gguf", "max_draft": 5}


def test_prompt_lookup_is_the_default_and_older_settings_get_it():
    stored_before_speculation = {"temperature": 0.2, "max_tokens": 64}
    s = ChatSettings.from_dict(stored_before_speculation)
    assert (s.speculation, s.draft_model, s.max_draft) == ("lookup", "", 8) and s.temperature == 0.2


def test_speculation_settings_are_clamped_and_bad_values_fall_back():
    assert ChatSettings.from_dict({"max_draft": 99}).max_draft == MAX_DRAFT_LIMIT
    assert ChatSettings.from_dict({"max_draft": 0}).max_draft == 1
    assert ChatSettings.from_dict({"max_draft": "3"}).max_draft == 3
    assert ChatSettings.from_dict({"speculation": "turbo"}).speculation == "lookup"
    assert ChatSettings.from_dict({"speculation": "off"}).speculation == "off"
    s = ChatSettings.from_dict({"speculation": 1, "draft_model": None, "max_draft": "many"})
    assert (s.speculation, s.draft_model, s.max_draft) == ("lookup", "", 8)
    assert ChatSettings(speculation="fast", max_draft=-2).clamped() == ChatSettings(max_draft=1)


def test_exports_leave_out_the_local_draft_model_and_import_with_defaults(tmp_path):
    store = ConversationStore(tmp_path / "hearth.db")
    chosen = ChatSettings(temperature=0.3, speculation="draft", draft_model="/home/me/models/small.gguf")
    conv = store.create_conversation("Tea", None, chosen)
    doc = conversation_document(store, conv.id)
    assert not {"speculation", "draft_model", "max_draft"} & doc["settings"].keys()
    imported = parse_document(json.dumps(doc).encode())
    assert imported.settings == dataclasses.replace(ChatSettings(), system_prompt=chosen.system_prompt,
                                                    temperature=0.3)
    store.close()


# -- which models may draft ------------------------------------------------------------------------------
def choice(path, usable=True):
    return ModelChoice(Path(path).name, str(path), "", usable)


def test_only_models_with_the_same_vocabulary_may_draft(tmp_path):
    smollm2, qwen, gemma = (str(model_path(name)) for name in ("smollm2", "qwen25coder", "gemma3"))
    twin = tmp_path / "smollm2-twin.gguf"
    twin.symlink_to(smollm2)
    compatibility = DraftCompatibility()
    assert compatibility.problem(smollm2, smollm2) is None and compatibility.problem(smollm2, str(twin)) is None
    assert "vocabulary" in compatibility.problem(smollm2, qwen) and "vocabulary" in compatibility.problem(gemma, qwen)
    assert "cannot read" in compatibility.problem(smollm2, str(tmp_path / "gone.gguf"))
    offered = compatibility.compatible(smollm2, [choice(smollm2), choice(qwen), choice(gemma), choice(twin),
                                                 choice(twin, usable=False)])
    assert [c.path for c in offered] == [str(twin)]  # not the model itself: drafting with it is never faster
    assert [c.path for c in compatibility.compatible(qwen, [choice(smollm2), choice(gemma)])] == []


# -- the settings panel ------------------------------------------------------------------------------------
@pytest.fixture
def panel(qtbot):
    panel = SettingsPanel()
    qtbot.addWidget(panel)
    panel.show()
    return panel


@pytest.mark.gui
@pytest.mark.qt_log_ignore("does not support propagateSizeHints")  # the offscreen plugin
def test_the_panel_shows_and_edits_the_speculation_settings(qtbot, panel):
    panel.set_draft_models([("Small", "/m/small.gguf"), ("Smaller", "/m/smaller.gguf")])
    panel.set_settings(ChatSettings(speculation="draft", draft_model="/m/smaller.gguf", max_draft=4))
    assert panel.speculation.currentText() == "Draft model" and panel.draft_model.currentText() == "Smaller"
    assert panel.max_draft.value() == 4 and panel.draft_model.isEnabled() and panel.draft_note.isHidden()
    with qtbot.waitSignal(panel.settings_changed, timeout=5000) as changed:
        panel.draft_model.setCurrentIndex(0)
    assert changed.args[0].draft_model == "/m/small.gguf" and changed.args[0].speculation == "draft"
    with qtbot.waitSignal(panel.settings_changed, timeout=5000) as changed:
        panel.speculation.setCurrentIndex(panel.speculation.findData("off"))
    assert changed.args[0].speculation == "off" and not panel.draft_model.isEnabled()
    assert not panel.max_draft.isEnabled()


@pytest.mark.gui
@pytest.mark.qt_log_ignore("does not support propagateSizeHints")  # the offscreen plugin
def test_an_unusable_or_missing_draft_model_is_explained(qtbot, panel):
    panel.set_draft_models([("Small", "/m/small.gguf")])
    panel.set_settings(ChatSettings(speculation="draft", draft_model="/m/other-family.gguf"))
    assert panel.draft_model.currentText() == "other-family.gguf (not usable)"
    assert panel.draft_note.isVisible() and "does not share this model's vocabulary" in panel.draft_note.text()
    assert panel.settings().draft_model == "/m/other-family.gguf"  # kept until the user picks another
    panel.set_draft_models([])
    panel.set_settings(ChatSettings(speculation="draft"))
    assert panel.draft_model.count() == 0 and "No model in the library" in panel.draft_note.text()
    panel.set_settings(ChatSettings(speculation="lookup"))
    assert panel.draft_note.isHidden()


@pytest.mark.gui
@pytest.mark.slow
def test_the_window_offers_only_library_models_that_can_draft(qtbot, make_session):
    session = make_session(engine_factory=FakeFactory(FakeModel()))
    window = session.window
    for name in ("smollm2", "qwen25coder", "gemma3"):
        window.model_choices.add_file(str(model_path(name)))
    window.settings_button.setChecked(True)
    offered = [window.settings_panel.draft_model.itemData(i) for i in range(window.settings_panel.draft_model.count())]
    assert str(model_path("qwen25coder")) in offered  # another copy of the built-in Qwen: the same vocabulary
    assert str(model_path("smollm2")) not in offered and str(model_path("gemma3")) not in offered
    assert session.controller.model_path() not in offered


def test_the_answer_line_keeps_speculation_in_its_tooltip_and_skips_malformed_figures():
    def line(**stats):
        message = Message(1, 1, 2, "assistant", "Hi", "complete",
                          {"generated_tokens": 9, "prefill_s": 0.1, "decode_tps": 20.0, **stats}, 0.0)
        assert "lookup" not in stats_text(message) and "draft" not in stats_text(message)  # plain words only
        return stats_details(message)
    assert "prompt lookup: 30 of 40 drafted tokens accepted (75%), ~1.42× plain speed (estimated)" in line(
        speculation="prompt lookup", drafted_tokens=40, accepted_tokens=30, speedup_estimate=1.42)
    assert "draft Tiny: nothing drafted" in line(speculation="draft Tiny", drafted_tokens=0, accepted_tokens=0)
    assert "accepted" not in line(speculation="prompt lookup", drafted_tokens="many", accepted_tokens=3)
    assert "accepted" not in line(speculation="prompt lookup", drafted_tokens=4, accepted_tokens=3,
                                  speedup_estimate="fast")
    assert "lookup" not in line()
