"""Per-answer statistics of recent generations, read from the store (each answer keeps its stats), and CSV export.

No Qt here. Stats are what the worker reported when the answer ended (tokens in and out, prompt-cache hits,
prefill and decode timings); ``time_to_first_token_s`` is recorded since the dashboard was added, so older
answers show the engine's prefill time instead, which differs from it only by rendering and tokenizing.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

from engine.atomic_write import atomic_write

from .model_names import reply_author
from .store import ConversationStore, Message

# (field, CSV header, table header)
COLUMNS = (
    ("started", "started", "Started"),
    ("conversation", "conversation", "Conversation"),
    ("model", "model", "Model"),
    ("prompt_tokens", "prompt_tokens", "Prompt"),
    ("cached_tokens", "cached_tokens", "Reused"),
    ("generated_tokens", "generated_tokens", "Reply"),
    ("time_to_first_token_s", "time_to_first_token_s", "First token"),
    ("prefill_tps", "prefill_tokens_per_s", "Reading"),
    ("decode_tps", "decode_tokens_per_s", "Writing"),
    ("finish_reason", "finish_reason", "Ended"),
)


ENDINGS = {"eos": "finished", "stop": "finished", "length": "length limit", "context": "context full",
           "cancelled": "stopped", "error": "error", "interrupted": "interrupted"}  # the table's words; CSV keeps keys


@dataclasses.dataclass(frozen=True)
class GenerationRecord:
    """One answer's statistics."""

    message_id: int
    conversation: str  # the conversation's title
    started_at: float  # epoch seconds, when the answer began
    model: str
    prompt_tokens: int
    cached_tokens: int  # prompt tokens whose KV state was reused
    generated_tokens: int
    time_to_first_token_s: float
    prefill_tps: float
    decode_tps: float
    finish_reason: str

    @property
    def started(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started_at))

    @classmethod
    def from_message(cls, message: Message, conversation: str) -> GenerationRecord:
        s = message.stats
        ttft = s.get("time_to_first_token_s", s.get("prefill_s", 0.0))
        reason = s.get("finish_reason") or ("error" if "error" in s else message.state)
        model = reply_author(s, "")  # the model that wrote it, by its display name
        return cls(message.id, conversation, message.created_at, model, int(s.get("prompt_tokens", 0)),
                   int(s.get("cached_tokens", 0)), int(s.get("generated_tokens", 0)), float(ttft),
                   float(s.get("prefill_tps", 0.0)), float(s.get("decode_tps", 0.0)), reason)

    def cells(self) -> list[str]:
        """The table's text for each column."""
        return [self.started[5:16].replace("-", "/", 1), self.conversation, self.model, f"{self.prompt_tokens:,}",
                f"{self.cached_tokens:,}", f"{self.generated_tokens:,}", f"{self.time_to_first_token_s:.2f} s",
                f"{self.prefill_tps:,.0f} tok/s", f"{self.decode_tps:,.1f} tok/s",
                ENDINGS.get(self.finish_reason, self.finish_reason)]


def recent_generations(store: ConversationStore, limit: int = 50) -> list[GenerationRecord]:
    """The latest ``limit`` answers with stats, newest first."""
    return [GenerationRecord.from_message(m, title) for m, title in store.recent_replies(limit)]


def write_csv(records: Iterable[GenerationRecord], out: TextIO) -> int:
    """Write ``records`` as CSV (a header row, then one row per answer) to ``out``; returns the rows written."""
    writer = csv.writer(out)
    writer.writerow([header for _, header, _ in COLUMNS])
    rows = 0
    for r in records:
        writer.writerow([getattr(r, field) for field, _, _ in COLUMNS])
        rows += 1
    return rows


def export_csv(records: Iterable[GenerationRecord], path: str | Path) -> int:
    """Write ``records`` to the CSV file ``path``; returns the rows written.

    Written through ``atomic_write``: a crash or a kill half-way leaves the previous file as it was.
    """
    with atomic_write(path) as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8", newline="")
        rows = write_csv(records, text)
        text.flush()
        text.detach()  # atomic_write still has to fsync and close the file
    return rows
