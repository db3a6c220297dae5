"""Conversations to and from files: versioned JSON (docs/conversation-format.md), Markdown, and zip archives.

No Qt. Every file is written through ``engine.atomic_write``, so a crash or a kill during an export leaves the
previous file intact. Imports are validated strictly before anything reaches the store: unknown keys, wrong
types, out-of-range settings, oversized files or members and duplicate keys are refused with a message that
names the offending field.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import time
import zipfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from engine import __version__
from engine.atomic_write import atomic_write

from .chat_settings import ChatSettings
from .model_names import reply_author
from .store import Conversation, ConversationStore

FORMAT, VERSION = "hearth-conversation", 3  # 2: a message's "thinking", the "enable_thinking" setting; 3: an
# answer's "alternatives" (the other answers of its turn, kept when the user regenerated)
ARCHIVE_FORMAT, ARCHIVE_VERSION = "hearth-archive", 1
MANIFEST = "manifest.json"
MAX_JSON_BYTES = 64 << 20  # one conversation file
MAX_ARCHIVE_BYTES = 2 << 30  # all members of an archive, uncompressed
MAX_CONVERSATIONS = 10_000
MAX_MESSAGES = 100_000
MAX_TEXT_CHARS = 16 << 20
MAX_TITLE_CHARS = 1000
IMPORTABLE_STATES = ("complete", "stopped", "interrupted", "error")
SHA256 = re.compile(r"[0-9a-f]{64}")
TOP_KEYS = {"format", "version", "exported_at", "exported_by", "title", "created_at", "updated_at", "model",
            "system_prompt", "settings", "messages"}
OPTIONAL_TOP_KEYS = {"exported_at", "exported_by"}
MESSAGE_KEYS = {"role", "content", "created_at", "state", "stats", "thinking", "alternatives"}
OPTIONAL_MESSAGE_KEYS = {"state", "stats", "thinking", "alternatives"}
ALTERNATIVE_KEYS = MESSAGE_KEYS - {"role", "alternatives"}
SINCE_VERSION_2 = {"thinking", "enable_thinking"}  # a version-1 document may not have them
SINCE_VERSION_3 = {"alternatives"}
MAX_ALTERNATIVES = 100
# speed choices of this machine (speculative decoding, a local draft model path): not part of the format
LOCAL_SETTINGS = {"speculation", "draft_model", "max_draft"}
SETTINGS_KEYS = {f.name for f in dataclasses.fields(ChatSettings)} - {"system_prompt"} - LOCAL_SETTINGS
OPTIONAL_SETTINGS = {"enable_thinking"}  # absent from version-1 documents


class ConversationFormatError(ValueError):
    """A file is not a conversation Hearth can import; the message names the field and what is wrong."""


@dataclasses.dataclass(frozen=True)
class ModelIdentity:
    """Which model a conversation was held with: its name, GGUF sha256 (None when unknown) and file name."""

    name: str
    sha256: str | None = None
    file: str | None = None


@dataclasses.dataclass(frozen=True)
class ImportedMessage:
    role: str
    content: str
    state: str
    stats: dict
    created_at: float
    thinking: str = ""
    alternatives: tuple[ImportedMessage, ...] = ()  # an answer's other answers in its turn, oldest first


@dataclasses.dataclass(frozen=True)
class ImportedConversation:
    """A validated conversation document, ready for ``add_to_store``."""

    title: str
    created_at: float
    updated_at: float
    model: ModelIdentity | None
    settings: ChatSettings
    messages: tuple[ImportedMessage, ...]


# -- export ----------------------------------------------------------------------------------------------
def conversation_document(store: ConversationStore, conversation_id: int, model: ModelIdentity | None = None,
                          clock: Callable[[], float] = time.time) -> dict:
    """The conversation as a JSON-ready dict in the documented format."""
    conv = store.conversation(conversation_id)
    settings = {k: v for k, v in conv.settings.to_dict().items() if k in SETTINGS_KEYS}
    system_prompt = conv.settings.system_prompt
    messages = [{"role": m.role, **_message_fields(m), **_alternatives_field(store, m)}
                for m in store.messages(conversation_id)]
    return {"format": FORMAT, "version": VERSION, "exported_at": iso_time(clock()),
            "exported_by": f"Hearth {__version__}", "title": conv.title, "created_at": iso_time(conv.created_at),
            "updated_at": iso_time(conv.updated_at), "model": dataclasses.asdict(model) if model else None,
            "system_prompt": system_prompt, "settings": settings, "messages": messages}


def _message_fields(m) -> dict:
    return {"content": m.content, "created_at": iso_time(m.created_at),
            "state": "interrupted" if m.state == "streaming" else m.state, "stats": m.stats,
            **({"thinking": m.thinking} if m.thinking else {})}


def _alternatives_field(store: ConversationStore, m) -> dict:
    """``{"alternatives": [...]}``: the other answers of ``m``'s turn, oldest first; ``{}`` when it has none."""
    if m.alternatives < 2:
        return {}
    return {"alternatives": [_message_fields(a) for a in store.alternatives(m.id) if a.id != m.id]}


def to_json_bytes(document: dict) -> bytes:
    return json.dumps(document, ensure_ascii=False, indent=2, allow_nan=False).encode("utf-8") + b"\n"


def to_markdown(document: dict) -> str:
    """A readable Markdown transcript of a conversation document (for reading and sharing; not re-importable)."""
    lines = [f"# {document['title']}", ""]
    model = document.get("model")
    if model:
        digest = f" (sha256 {model['sha256']})" if model.get("sha256") else ""
        lines.append(f"- Model: {model['name']}{digest}")
    lines.append(f"- Started: {_readable_time(document['created_at'])}")
    lines.append("- Settings: " + ", ".join(f"{k.replace('_', ' ')} {_setting_text(v)}"
                                            for k, v in document["settings"].items()))
    lines.append("")
    if document["system_prompt"].strip():
        lines += ["## System prompt", "", *[f"> {line}" for line in document["system_prompt"].splitlines()], ""]
    for m in document["messages"]:
        note = "" if m["state"] == "complete" else f" ({m['state']})"
        author = m["role"].capitalize()
        if m["role"] == "assistant":  # the model that wrote this reply, from its stats
            written_by = reply_author(m.get("stats") or {}, "")
            author += f" ({written_by})" if written_by else ""
        lines += [f"## {author} — {_readable_time(m['created_at'])}{note}", ""]
        if m.get("thinking"):
            lines += [*_thinking_quote(m["thinking"], m.get("stats", {}).get("thinking_tokens")), ""]
        lines += [m["content"], ""]
        for n, other in enumerate(m.get("alternatives", ()), 1):
            lines += [f"### Other answer {n} of {len(m['alternatives'])} — {_readable_time(other['created_at'])}", ""]
            if other.get("thinking"):
                lines += [*_thinking_quote(other["thinking"], other.get("stats", {}).get("thinking_tokens")), ""]
            lines += [other["content"], ""]
    return "\n".join(lines)


def _setting_text(value) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def _thinking_quote(thinking: str, tokens) -> list[str]:
    """The model's reasoning as a block quote headed "Thinking", apart from the answer that follows it."""
    count = f" ({tokens:,} tokens)" if isinstance(tokens, int) and not isinstance(tokens, bool) else ""
    return [f"> **Thinking**{count}", ">", *[f"> {line}".rstrip() for line in thinking.splitlines()]]


def export_json(store: ConversationStore, conversation_id: int, path: str | Path,
                model: ModelIdentity | None = None) -> None:
    data = to_json_bytes(conversation_document(store, conversation_id, model))
    with atomic_write(path) as f:
        f.write(data)


def export_markdown(store: ConversationStore, conversation_id: int, path: str | Path,
                    model: ModelIdentity | None = None) -> None:
    data = to_markdown(conversation_document(store, conversation_id, model)).encode("utf-8")
    with atomic_write(path) as f:
        f.write(data)


def export_archive(store: ConversationStore, path: str | Path,
                   model_for: Callable[[Conversation], ModelIdentity | None] = lambda conv: None,
                   on_progress: Callable[[int, int], None] | None = None) -> int:
    """Every conversation as one zip: ``manifest.json`` and ``conversations/NNNNN.json``; returns how many.

    ``on_progress(done, total)`` is called after each conversation is written.
    """
    conversations = store.conversations()
    entries = []
    with atomic_write(path) as f, zipfile.ZipFile(f, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for i, conv in enumerate(conversations, 1):
            data = to_json_bytes(conversation_document(store, conv.id, model_for(conv)))
            name = f"conversations/{i:05d}.json"
            archive.writestr(name, data)
            entries.append({"file": name, "title": conv.title, "sha256": hashlib.sha256(data).hexdigest()})
            if on_progress:
                on_progress(i, len(conversations))
        manifest = {"format": ARCHIVE_FORMAT, "version": ARCHIVE_VERSION, "exported_at": iso_time(time.time()),
                    "exported_by": f"Hearth {__version__}", "conversations": entries}
        archive.writestr(MANIFEST, to_json_bytes(manifest))
    return len(entries)


# -- import ----------------------------------------------------------------------------------------------
def read_json_file(path: str | Path) -> ImportedConversation:
    """Read and validate one exported conversation file."""
    with open(path, "rb") as f:
        data = f.read(MAX_JSON_BYTES + 1)
    if len(data) > MAX_JSON_BYTES:
        raise ConversationFormatError(f"the file is larger than {MAX_JSON_BYTES >> 20} MB; not a conversation export")
    return parse_document(data)


def parse_document(data: bytes) -> ImportedConversation:
    """Validate a conversation document (UTF-8 JSON bytes) strictly and convert it."""
    return _conversation(_loads(data))


def from_document(document) -> ImportedConversation:
    """Validate an already parsed document (e.g. the ``conversation`` of a session snapshot) strictly."""
    return _conversation(document)


def read_archive(path: str | Path) -> list[ImportedConversation]:
    """Read and validate a whole archive; nothing is returned unless every conversation in it is valid."""
    try:
        with zipfile.ZipFile(path) as archive:
            members = _check_members(archive)
            manifest = _archive_manifest(_read_member(archive, members, MANIFEST))
            listed = {e["file"] for e in manifest}
            extra = sorted(set(members) - listed - {MANIFEST})
            if extra:
                raise ConversationFormatError(f"the archive holds files its manifest does not list: {extra[:3]}")
            out = []
            for entry in manifest:
                data = _read_member(archive, members, entry["file"])
                if hashlib.sha256(data).hexdigest() != entry["sha256"]:
                    raise ConversationFormatError(f"{entry['file']} does not match its checksum in the manifest")
                out.append(_prefixed(entry["file"], parse_document, data))
            return out
    except zipfile.BadZipFile as e:
        raise ConversationFormatError(f"not a zip archive ({e})") from None


def add_to_store(store: ConversationStore, conversation: ImportedConversation,
                 model_path: str | None = None) -> Conversation:
    """Add a validated conversation to the store as a new conversation."""
    messages = [(m.role, m.content, m.state, m.stats, m.created_at, m.thinking,
                 [(a.content, a.state, a.stats, a.created_at, a.thinking) for a in m.alternatives])
                for m in conversation.messages]
    return store.import_conversation(conversation.title, model_path, conversation.settings, messages,
                                     conversation.created_at, conversation.updated_at)


def _check_members(archive: zipfile.ZipFile) -> dict[str, zipfile.ZipInfo]:
    infos = archive.infolist()
    if len(infos) > MAX_CONVERSATIONS + 1:
        raise ConversationFormatError(f"the archive has {len(infos)} files; at most {MAX_CONVERSATIONS} "
                                      "conversations are imported at once")
    members: dict[str, zipfile.ZipInfo] = {}
    for info in infos:
        if info.filename in members:
            raise ConversationFormatError(f"the archive holds {info.filename!r} twice")
        members[info.filename] = info
    if sum(i.file_size for i in infos) > MAX_ARCHIVE_BYTES:
        raise ConversationFormatError(f"the archive unpacks to more than {MAX_ARCHIVE_BYTES >> 30} GB")
    return members


def _read_member(archive: zipfile.ZipFile, members: dict[str, zipfile.ZipInfo], name: str) -> bytes:
    info = members.get(name)
    if info is None:
        raise ConversationFormatError(f"the archive has no {name}" + (" (not a Hearth archive)" if name == MANIFEST else ""))
    if info.file_size > MAX_JSON_BYTES:
        raise ConversationFormatError(f"{name} is larger than {MAX_JSON_BYTES >> 20} MB")
    with archive.open(info) as f:
        data = f.read(MAX_JSON_BYTES + 1)  # the size in the zip's directory may lie; never read past the limit
    if len(data) > MAX_JSON_BYTES:
        raise ConversationFormatError(f"{name} unpacks to more than {MAX_JSON_BYTES >> 20} MB")
    return data


def _archive_manifest(data: bytes) -> list[dict]:
    doc = _prefixed(MANIFEST, _loads, data)
    _expect_keys(doc, {"format", "version", "exported_at", "exported_by", "conversations"},
                 {"exported_at", "exported_by"}, MANIFEST)
    _check_format(doc, ARCHIVE_FORMAT, ARCHIVE_VERSION, MANIFEST)
    entries = _typed(doc["conversations"], list, f"{MANIFEST}: conversations")
    if len(entries) > MAX_CONVERSATIONS:
        raise ConversationFormatError(f"the archive lists {len(entries)} conversations; the limit is {MAX_CONVERSATIONS}")
    seen = set()
    for i, entry in enumerate(entries):
        where = f"{MANIFEST}: conversations[{i}]"
        _expect_keys(_typed(entry, dict, where), {"file", "title", "sha256"}, set(), where)
        name = _typed(entry["file"], str, f"{where}.file")
        if not re.fullmatch(r"conversations/\d{5}\.json", name) or name in seen:
            raise ConversationFormatError(f"{where}.file: {name!r} is not a unique conversations/NNNNN.json name")
        seen.add(name)
        if not SHA256.fullmatch(_typed(entry["sha256"], str, f"{where}.sha256")):
            raise ConversationFormatError(f"{where}.sha256: expected 64 lowercase hex digits")
    return entries


def _loads(data: bytes):
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConversationFormatError(f"the file is not UTF-8 text ({e.reason} at byte {e.start})") from None
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise ConversationFormatError(f"not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None
    except RecursionError:
        raise ConversationFormatError("not a conversation: the JSON is nested too deeply") from None


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    out = {}
    for key, value in pairs:
        if key in out:
            raise ConversationFormatError(f"the key {key!r} appears twice in one object")
        out[key] = value
    return out


def _no_constant(name: str):
    raise ConversationFormatError(f"{name} is not a valid number here")


def _conversation(doc) -> ImportedConversation:
    _expect_keys(_typed(doc, dict, "the document"), TOP_KEYS, OPTIONAL_TOP_KEYS, "the document")
    _check_format(doc, FORMAT, VERSION, "the document")
    title = _text(doc["title"], "title", MAX_TITLE_CHARS).strip() or "Untitled"
    messages = _typed(doc["messages"], list, "messages")
    if len(messages) > MAX_MESSAGES:
        raise ConversationFormatError(f"messages: {len(messages)} messages; at most {MAX_MESSAGES} are imported")
    drop = (SINCE_VERSION_2 if doc["version"] < 2 else set()) | (SINCE_VERSION_3 if doc["version"] < 3 else set())
    settings = _settings(doc["settings"], _text(doc["system_prompt"], "system_prompt", MAX_TEXT_CHARS), drop)
    return ImportedConversation(title, parse_time(doc["created_at"], "created_at"),
                                parse_time(doc["updated_at"], "updated_at"), _model(doc["model"]), settings,
                                tuple(_message(m, i, drop) for i, m in enumerate(messages)))


def _check_format(doc: dict, name: str, version: int, where: str) -> None:
    if doc["format"] != name:
        raise ConversationFormatError(f"{where}: format is {doc['format']!r}, expected {name!r}")
    v = doc["version"]
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ConversationFormatError(f"{where}: version must be a positive integer, not {v!r}")
    if v > version:
        raise ConversationFormatError(f"{where} was written by a newer Hearth (format version {v}; this Hearth reads "
                                      f"up to {version}); update Hearth to import it")
    for key in ("exported_at", "exported_by"):
        if key in doc:
            _text(doc[key], f"{where}: {key}", 200)


def _model(value) -> ModelIdentity | None:
    if value is None:
        return None
    _expect_keys(_typed(value, dict, "model"), {"name", "sha256", "file"}, {"file"}, "model")
    digest = value["sha256"]
    if digest is not None and not (isinstance(digest, str) and SHA256.fullmatch(digest)):
        raise ConversationFormatError("model.sha256: expected null or 64 lowercase hex digits")
    file = value.get("file")
    if file is not None and (not isinstance(file, str) or "/" in file or "\\" in file or len(file) > 500):
        raise ConversationFormatError("model.file: expected null or a bare file name")
    return ModelIdentity(_text(value["name"], "model.name", 500), digest, file)


def _settings(value, system_prompt: str, drop: set[str]) -> ChatSettings:
    _expect_keys(_typed(value, dict, "settings"), SETTINGS_KEYS - drop, OPTIONAL_SETTINGS, "settings")
    defaults = ChatSettings()
    values = {}
    for key, v in value.items():
        kind = type(getattr(defaults, key))
        if kind is bool:
            ok = isinstance(v, bool)
        else:
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (kind is float or isinstance(v, int))
        if not ok:
            raise ConversationFormatError(f"settings.{key}: expected a {kind.__name__}, not {v!r}")
        values[key] = kind(v)
    settings = dataclasses.replace(defaults, system_prompt=system_prompt, **values)
    for key, v in settings.clamped().to_dict().items():
        if v != getattr(settings, key):
            raise ConversationFormatError(f"settings.{key}: {getattr(settings, key)!r} is out of range")
    return settings


def _message(value, i: int, drop: set[str], where: str = "") -> ImportedMessage:
    where = where or f"messages[{i}]"
    keys = ALTERNATIVE_KEYS if where.endswith("]") and ".alternatives[" in where else MESSAGE_KEYS
    _expect_keys(_typed(value, dict, where), keys - drop, OPTIONAL_MESSAGE_KEYS, where)
    role = value.get("role", "assistant")
    if role not in ("user", "assistant"):
        raise ConversationFormatError(f"{where}.role: expected 'user' or 'assistant', not {role!r}")
    state = value.get("state", "complete")
    if state not in IMPORTABLE_STATES:
        raise ConversationFormatError(f"{where}.state: expected one of {', '.join(IMPORTABLE_STATES)}, not {state!r}")
    stats = _typed(value.get("stats", {}), dict, f"{where}.stats")
    if len(stats) > 64 or not all(isinstance(v, (str, int, float, bool)) or v is None for v in stats.values()):
        raise ConversationFormatError(f"{where}.stats: expected at most 64 plain values (numbers, text, booleans)")
    alternatives = _typed(value.get("alternatives", []), list, f"{where}.alternatives")
    if alternatives and role != "assistant":
        raise ConversationFormatError(f"{where}.alternatives: only an answer has alternatives")
    if len(alternatives) > MAX_ALTERNATIVES:
        raise ConversationFormatError(f"{where}.alternatives: at most {MAX_ALTERNATIVES} are imported")
    return ImportedMessage(role, _text(value["content"], f"{where}.content", MAX_TEXT_CHARS), state, stats,
                           parse_time(value["created_at"], f"{where}.created_at"),
                           _text(value.get("thinking", ""), f"{where}.thinking", MAX_TEXT_CHARS),
                           tuple(_message(a, j, drop, f"{where}.alternatives[{j}]") for j, a in enumerate(alternatives)))


def _expect_keys(doc: dict, allowed: set[str], optional: set[str], where: str) -> None:
    missing = sorted(allowed - optional - doc.keys())
    unknown = sorted(doc.keys() - allowed)
    if missing:
        raise ConversationFormatError(f"{where}: missing {', '.join(missing)}")
    if unknown:
        raise ConversationFormatError(f"{where}: unknown field {', '.join(map(repr, unknown[:5]))}")


def _typed(value, kind: type, where: str):
    if not isinstance(value, kind):
        names = {dict: "an object", list: "a list", str: "text"}
        raise ConversationFormatError(f"{where}: expected {names.get(kind, kind.__name__)}, not "
                                      f"{type(value).__name__}")
    return value


def _text(value, where: str, limit: int) -> str:
    _typed(value, str, where)
    if len(value) > limit:
        raise ConversationFormatError(f"{where}: longer than {limit:,} characters")
    return value


def _prefixed(where: str, parse, data):
    try:
        return parse(data)
    except ConversationFormatError as e:
        raise ConversationFormatError(f"{where}: {e}") from None


# -- time stamps -----------------------------------------------------------------------------------------
def iso_time(t: float) -> str:
    """Seconds since the epoch as ISO 8601 in UTC with milliseconds: ``2025-01-31T12:00:00.000Z``."""
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_time(value, where: str) -> float:
    """An ISO 8601 time with a time zone back to seconds since the epoch."""
    _text(value, where, 64)
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None:
        raise ConversationFormatError(f"{where}: {value!r} is not an ISO 8601 time with a time zone")
    return parsed.timestamp()


def _readable_time(iso: str) -> str:
    return datetime.fromisoformat(iso).strftime("%Y-%m-%d %H:%M UTC")
