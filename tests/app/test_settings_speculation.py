"""Speculative decoding settings: stored per conversation, clamped, and kept out of conversation exports."""

import dataclasses
import json

from app.chat_settings import MAX_DRAFT_LIMIT, ChatSettings
from app.conversation_export import conversation_document, parse_document
from app.store import ConversationStore


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
