"""Context-overflow policy: keep the system prompt and drop the oldest turns, or refuse."""

from __future__ import annotations

from collections.abc import Callable

OVERFLOW_POLICIES = ("drop_oldest", "stop")


class ContextOverflowError(ValueError):
    """The prompt does not fit the context window under the chosen policy."""


def reply_room(n_ctx: int, max_tokens: int) -> int:
    """The tokens of an ``n_ctx`` context kept free for the reply: its length limit, at most a quarter of it."""
    return min(max_tokens, n_ctx // 4)


def fit_messages(messages: list[dict], count_tokens: Callable[[list[dict]], int], budget: int,
                 policy: str = "drop_oldest", reply_room: int = 0) -> tuple[list[dict], int]:
    """Drop the oldest non-system messages until the rendered prompt fits ``budget`` tokens.

    Args:
        messages: role/content dicts; leading system messages are always kept, and so is the last message.
        count_tokens: tokens of the rendered prompt for a list of messages.
        budget: the most prompt tokens allowed (the context minus room for the reply).
        policy: "drop_oldest" or "stop" (raise instead of dropping).
        reply_room: the tokens kept for the reply (``budget`` plus this is the context length), so that a refusal
            names the context length the user chose and the room the reply keeps.

    Returns:
        The messages kept and how many were dropped.
    """
    if policy not in OVERFLOW_POLICIES:
        raise ValueError(f"unknown overflow policy {policy!r} (choose from {', '.join(OVERFLOW_POLICIES)})")
    n_system = 0
    while n_system < len(messages) and messages[n_system].get("role") == "system":
        n_system += 1
    system, turns = messages[:n_system], messages[n_system:]
    dropped = 0
    room = (f"the context of {budget + reply_room:,} tokens, which keeps {reply_room:,} for the reply"
            if reply_room else f"{budget:,} tokens")
    while count_tokens(system + turns) > budget:
        if policy == "stop":
            raise ContextOverflowError(f"the conversation does not fit in {room}")
        if len(turns) <= 1:
            raise ContextOverflowError(f"the last message alone does not fit in {room}")
        # drop a whole user/assistant exchange where possible so roles keep alternating
        step = 2 if len(turns) > 2 and turns[0].get("role") == "user" and turns[1].get("role") == "assistant" else 1
        turns = turns[step:]
        dropped += step
    return system + turns, dropped
