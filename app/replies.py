"""What a reply asks the engine worker for, and the figures it reports when it ends: dataclasses, not option dicts.

``ReplyRequest.from_options`` reads the options dict the chat controller builds (``EngineHost.generate``'s
argument) once, at the host; ``ReplyStats.as_dict`` is the ``finished`` signal's payload.
"""

from __future__ import annotations

import dataclasses

from engine.generate import GenerationEvent

from .speculation import SpeculationChoice

DEFAULT_MAX_TOKENS = 512


@dataclasses.dataclass(frozen=True)
class ReplyRequest:
    """One reply to generate: the conversation, the model it runs on and how to sample it."""

    request_id: int
    path: str  # the model file
    n_ctx: int
    messages: tuple[dict, ...]
    max_tokens: int = DEFAULT_MAX_TOKENS
    sampling: dict = dataclasses.field(default_factory=dict)  # the sampling parameters, for the params factory
    conversation_id: int | None = None  # whose KV state is swapped in first
    speculation: SpeculationChoice = SpeculationChoice()
    thermal_mode: str | None = None  # "performance", "balanced" or "cool"; None keeps the current mode
    template_vars: dict = dataclasses.field(default_factory=dict)  # more chat-template variables (enable_thinking)

    @classmethod
    def from_options(cls, request_id: int, path: str, n_ctx: int, messages: list[dict], options: dict) -> ReplyRequest:
        """From the options dict: max_tokens, conversation_id, speculation, thermal_mode, template_vars; the rest is
        sampling."""
        sampling = dict(options)
        max_tokens = int(sampling.pop("max_tokens", DEFAULT_MAX_TOKENS))
        conversation_id = sampling.pop("conversation_id", None)
        speculation = SpeculationChoice.from_options(sampling.pop("speculation", None))
        mode = sampling.pop("thermal_mode", None)
        template_vars = dict(sampling.pop("template_vars", None) or {})
        return cls(request_id, path, n_ctx, tuple(dict(m) for m in messages), max_tokens, sampling, conversation_id,
                   speculation, mode, template_vars)

    @property
    def model_key(self) -> tuple[str, int]:
        return self.path, self.n_ctx


@dataclasses.dataclass(frozen=True)
class ReplyStats:
    """A finished reply's figures. Timings are absent when it ended before its first token."""

    finish_reason: str
    generated_tokens: int
    dropped: int = 0  # messages left out to fit the context
    n_ctx: int | None = None
    model: str | None = None
    last: GenerationEvent | None = None  # the reply's last token event, which carries its timings
    time_to_first_token_s: float | None = None  # from when the worker took the request
    batched: bool = False  # it decoded beside another reply for part of the way
    extra: dict = dataclasses.field(default_factory=dict)  # speculation figures, a notice, the snapshot note

    def as_dict(self) -> dict:
        stats = {"dropped": self.dropped, "n_ctx": self.n_ctx, "model": self.model}
        stats = {k: v for k, v in stats.items() if v is not None}
        stats.update(finish_reason=self.finish_reason, generated_tokens=self.generated_tokens)
        last = self.last
        if last is not None:
            stats.update(prompt_tokens=last.prompt_tokens, cached_tokens=last.cached_tokens,
                         prefill_s=round(last.prefill_s, 4), decode_s=round(last.decode_s, 4),
                         prefill_tps=round(last.prefill_tps, 2), decode_tps=round(last.decode_tps, 2),
                         context_used=last.prompt_tokens + last.generated_tokens)
        if self.time_to_first_token_s is not None:
            stats["time_to_first_token_s"] = round(self.time_to_first_token_s, 4)
        if self.batched:
            stats["batched"] = True
        return {**stats, **self.extra}
