"""Speculative decoding for chat replies: the speculator a reply asks for, its draft model, and its figures.

No Qt here; the engine worker owns one ``Speculators`` and calls it on the engine thread. A speculator is
kept across replies while the choice stays the same, so the adaptive draft length starts each answer from
what it measured on the last one, and a draft model is loaded once. A draft model that cannot be used
(missing, unreadable, another vocabulary) never fails a reply: it is answered without speculation and the
reason is returned as a notice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from engine.speculative import Speculator, draft_model_speculator, prompt_lookup_speculator

from .paths import file_name

LOOKUP, DRAFT = "lookup", "draft"


@dataclasses.dataclass(frozen=True)
class SpeculationChoice:
    """What a reply asks for: ``mode`` "off", "lookup" or "draft", the draft model's path and the draft cap."""

    mode: str = "off"
    draft_model: str = ""
    max_draft: int = 8

    @classmethod
    def from_options(cls, options: dict | None) -> SpeculationChoice:
        """From ``ChatSettings.speculation_options()``; None (a request without the key) means off."""
        if not options:
            return cls()
        return cls(str(options.get("mode", "off")), str(options.get("draft_model") or ""),
                   int(options.get("max_draft", cls.max_draft)))


class Speculators:
    """Builds each reply's Speculator for the loaded model and keeps it, and its draft model, while the choice
    stays the same. ``close`` (model switch or unload) drops both."""

    def __init__(self, load_model: Callable[[str, int], object], announce: Callable[[str], None] = lambda text: None):
        """``load_model(path, n_ctx)`` loads a draft model (the worker's engine factory); ``announce`` gets a
        progress line before a draft model loads."""
        self._load_model, self._announce = load_model, announce
        self._key: tuple | None = None  # (mode, draft path) of self.speculator
        self.speculator: Speculator | None = None
        self.method = ""  # "prompt lookup" or "draft <name>", for the reply's stats
        self._draft = None  # the loaded draft engine.model.Model
        self._failed: dict[str, str] = {}  # draft path -> why it cannot draft for the loaded model

    def for_reply(self, target, choice: SpeculationChoice) -> tuple[Speculator | None, str | None]:
        """The speculator for a reply of ``target`` (None for plain decoding) and a notice when ``choice``
        could not be honoured. Call ``close`` before passing another target."""
        key = (choice.mode, choice.draft_model)
        if key != self._key and self._draft is not None:
            self.close_draft()  # kept only while the same draft model is chosen
        if choice.mode not in (LOOKUP, DRAFT):
            return None, None
        if key != self._key:
            notice = self._build(target, choice)
            if notice is not None:
                return None, notice
            self._key = key
        self.speculator.max_draft = max(1, choice.max_draft)
        return self.speculator, None

    def _build(self, target, choice: SpeculationChoice) -> str | None:
        if choice.mode == LOOKUP:
            self.speculator, self.method = prompt_lookup_speculator(choice.max_draft), "prompt lookup"
            return None
        if not choice.draft_model:
            return "No draft model is chosen for speculative decoding; this answer was generated without it."
        if choice.draft_model in self._failed:
            return self._failed[choice.draft_model]
        try:
            draft = self._draft_model(choice.draft_model, target.n_ctx)
            self.speculator = draft_model_speculator(target, draft, choice.max_draft)
        except Exception as exc:  # noqa: BLE001 - any reason a draft cannot be used leaves plain decoding
            self.close_draft()
            reason = str(exc).strip() or type(exc).__name__
            notice = (f"The draft model {file_name(choice.draft_model)} cannot be used: {reason}. This answer was "
                      "generated without speculative decoding.")
            self._failed[choice.draft_model] = notice
            return notice
        self.method = f"draft {draft.name}"
        return None

    def _draft_model(self, path: str, n_ctx: int):
        self._announce(f"Loading the draft model {file_name(path)}…")
        self._draft = self._load_model(path, n_ctx)
        return self._draft

    def close_draft(self) -> None:
        """Close the draft model, and forget the speculator drafting with it."""
        draft, self._draft = self._draft, None
        if draft is not None:
            self.speculator, self._key, self.method = None, None, ""
            draft.close()

    def close(self) -> None:
        """The target model changes or goes: forget the speculator, close the draft model, retry failed drafts."""
        self.close_draft()
        self.speculator, self._key, self.method = None, None, ""
        self._failed.clear()


def estimated_speedup(decode_tps: float, plain_step_s: float | None) -> float | None:
    """Measured decode tokens/sec over plain decoding's (one token per ``plain_step_s``, as the adaptive
    controller last measured it); None before a plain step was measured."""
    if not plain_step_s or decode_tps <= 0:
        return None
    return decode_tps * plain_step_s


def speculation_stats(speculator: Speculator, method: str, decode_tps: float) -> dict:
    """A reply's speculation figures, for its stats: what was drafted and kept, and the estimated speed-up."""
    s = speculator.stats
    stats = {"speculation": method, "drafted_tokens": s.proposed, "accepted_tokens": s.accepted,
             "verify_passes": s.verify_passes, "plain_steps": s.plain_steps,
             "acceptance_rate": round(s.acceptance_rate, 4), "tokens_per_verify": round(s.tokens_per_verify, 3)}
    speedup = estimated_speedup(decode_tps, speculator.controller.costs.step_s)
    if speedup is not None:
        stats["speedup_estimate"] = round(speedup, 3)
    return stats


def speculation_text(method: str, drafted: int, accepted: int, speedup: float | None) -> str:
    """One line for people: what was drafted and kept, and the estimated speed-up when one was measured."""
    if not drafted:
        return f"{method}: nothing drafted"
    text = f"{method}: {accepted:,} of {drafted:,} drafted tokens accepted ({accepted / drafted:.0%})"
    return text + (f", ~{speedup:.2f}× plain speed (estimated)" if speedup is not None else "")
