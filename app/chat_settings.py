"""Per-conversation generation settings: system prompt, sampling, reply length, context length, speculation,
thinking."""

from __future__ import annotations

import dataclasses

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."
SPECULATION_MODES = ("off", "lookup", "draft")  # no speculation, prompt lookup, a draft model
MAX_DRAFT_LIMIT = 16


@dataclasses.dataclass(frozen=True)
class ChatSettings:
    """What one conversation asks of the model. Defaults suit small instruct models such as SmolLM2.

    ``seed`` -1 means a fresh random seed for every reply. Speculation is on by default as prompt lookup: it
    costs nothing to propose, the adaptive draft length switches it off while it does not pay, greedy answers
    are unchanged and sampled ones keep the model's distribution. ``draft_model`` is a GGUF path, used in
    "draft" mode.
    """

    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.1
    max_tokens: int = 512
    seed: int = -1
    n_ctx: int = 4096
    speculation: str = "lookup"  # one of SPECULATION_MODES
    draft_model: str = ""
    max_draft: int = 8  # the most tokens drafted per verify pass; the adaptive controller often drafts fewer
    enable_thinking: bool = True  # the chat template's own switch, for templates that read enable_thinking

    @classmethod
    def from_dict(cls, data: dict) -> ChatSettings:
        """Settings from stored JSON: unknown keys are ignored, missing ones take the defaults, bad ones too."""
        known = {f.name: f for f in dataclasses.fields(cls)}
        values = {}
        for key, value in data.items():
            field = known.get(key)
            if field is None:
                continue
            default = field.default
            if isinstance(default, str) and not isinstance(value, str):
                continue  # str() of a number or null would make a mode or path that was never chosen
            if isinstance(default, bool) and not isinstance(value, bool):
                continue  # bool() of "false" is True
            try:
                values[key] = type(default)(value)
            except (TypeError, ValueError):
                continue
        return cls(**values).clamped()

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def clamped(self) -> ChatSettings:
        """The same settings with every number inside its sensible range."""
        return dataclasses.replace(
            self,
            temperature=min(max(self.temperature, 0.0), 2.0),
            top_p=min(max(self.top_p, 0.0), 1.0),
            top_k=max(self.top_k, 0),
            min_p=min(max(self.min_p, 0.0), 1.0),
            repeat_penalty=min(max(self.repeat_penalty, 0.5), 2.0),
            max_tokens=min(max(self.max_tokens, 1), 32768),
            seed=max(self.seed, -1),
            n_ctx=min(max(self.n_ctx, 256), 131072),
            speculation=self.speculation if self.speculation in SPECULATION_MODES else ChatSettings.speculation,
            max_draft=min(max(self.max_draft, 1), MAX_DRAFT_LIMIT),
        )

    def sampling_kwargs(self) -> dict:
        """Keyword arguments for ``engine.sampling.SamplingParams`` (seed None for a random one)."""
        return dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                    repeat_penalty=self.repeat_penalty, seed=None if self.seed < 0 else self.seed)

    def template_options(self) -> dict:
        """Chat-template variables this conversation asks for; the engine passes on only those a template reads."""
        return {"enable_thinking": self.enable_thinking}

    def speculation_options(self) -> dict:
        """What the engine worker needs to build the reply's speculator (``app.speculation.SpeculationChoice``)."""
        return {"mode": self.speculation, "draft_model": self.draft_model, "max_draft": self.max_draft}
