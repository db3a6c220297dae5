"""How many tokens to draft: a cost model fed by running acceptance rates and measured step and verify times.

With per-token acceptance ``a``, a round that drafts ``k`` tokens emits ``1 + a + ... + a^k`` tokens on average
(the accepted prefix plus the target's own token) and costs one verify pass of ``k + 1`` positions plus the
drafting. The controller picks the ``k`` with the best expected tokens per second relative to plain decoding;
when no ``k`` beats plain decoding it switches speculation off for a while (doubling the pause on every failed
re-probe) and then probes again. A kind that costs nothing to propose (prompt lookup) is not probed: its
proposals are checked against the plain steps' tokens instead (``observe``), which switches it back on as soon
as the estimate says it pays. Nothing here reads a clock: the caller passes the durations it measured.
"""

from __future__ import annotations

import dataclasses

TIMING_WEIGHT = 0.15  # weight of a new sample in the timing EWMAs
ACCEPTANCE_DECAY = 0.85  # per accept/reject outcome: the last six or so count (copying starts and stops abruptly)
PRIOR_WEIGHT = 2.0  # a kind's prior acceptance counts as this many outcomes
PRIOR_EXTRA_FRACTION = 0.35  # a verified position costs this much of a plain step until measured
MIN_BACKOFF, MAX_BACKOFF = 8, 128  # tokens of plain decoding before re-probing a kind that did not pay
RECALIBRATE_ROUNDS = 32  # a plain step at least this often keeps the baseline current (load, context length)
CATCH_UP_TOLERANCE = 2  # a draft that first had to process more history tokens than this is not timed


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens a round emits on average: ``sum(a^i for i in 0..k)``."""
    if acceptance >= 1.0:
        return k + 1.0
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


def expected_speedup(acceptance: float, k: int, step_s: float, extra_s: float, draft_s: float) -> float:
    """Tokens per second of rounds drafting ``k`` tokens over those of plain decoding."""
    return expected_tokens(acceptance, k) * step_s / (step_s + k * (extra_s + draft_s))


def best_draft_length(acceptance: float, cap: int, step_s: float, extra_s: float,
                      draft_s: float) -> tuple[int, float]:
    """The ``k`` in ``1..cap`` with the best expected speedup, and that speedup."""
    return max(((k, expected_speedup(acceptance, k, step_s, extra_s, draft_s)) for k in range(1, cap + 1)),
               key=lambda pair: pair[1])


def ewma(old: float | None, sample: float, weight: float = TIMING_WEIGHT) -> float:
    return sample if old is None else old + weight * (sample - old)


@dataclasses.dataclass
class KindState:
    """Acceptance and on/off state of one kind of proposal (a draft model, or n-gram matches of one length)."""

    accepted: float  # decayed count of accepted drafted tokens
    observed: float  # decayed count of accept/reject outcomes
    off_until: int = 0  # generated-token position before which this kind is not proposed
    backoff: int = MIN_BACKOFF  # the next pause, in tokens
    probe_next: bool = False  # the pause just ended: try one round whatever the estimate says

    @classmethod
    def with_prior(cls, acceptance: float) -> KindState:
        return cls(accepted=acceptance * PRIOR_WEIGHT, observed=PRIOR_WEIGHT)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.observed

    def observe(self, accepted: int, rejected: bool) -> None:
        for outcome in [1.0] * accepted + [0.0] * rejected:
            self.accepted = self.accepted * ACCEPTANCE_DECAY + outcome
            self.observed = self.observed * ACCEPTANCE_DECAY + 1.0


@dataclasses.dataclass
class Costs:
    """Measured durations (EWMAs, seconds); None until first measured."""

    step_s: float | None = None  # a plain decode step, sampling included
    extra_s: float | None = None  # a verify pass's cost per drafted position beyond a plain step
    draft_s: float | None = None  # proposing, per drafted token


class AdaptiveDraftLength:
    """Chooses each round's draft length.

    ``max_draft`` is a cap anyone may lower at any time (the thermal policy does under pressure); 0 switches
    speculation off. With ``adaptive=False`` every round drafts the cap (tests of exactness use this).
    """

    def __init__(self, max_draft: int = 8, adaptive: bool = True):
        if max_draft < 0:
            raise ValueError(f"max_draft must be at least 0, got {max_draft}")
        self.max_draft, self.adaptive = max_draft, adaptive
        self.costs = Costs()
        self.kinds: dict[str, KindState] = {}
        self.rounds_since_plain = 0

    def begin(self) -> None:
        """A new generation: positions start again at 0. Acceptance and step costs carry over as priors; the
        proposer's cost is measured afresh (one slow measurement must not switch a draft model off for good)."""
        for state in self.kinds.values():
            state.off_until, state.backoff, state.probe_next = 0, MIN_BACKOFF, False
        self.costs.draft_s = None

    def draft_length(self, kind: str, available: int, position: int, prior: float = 0.5,
                     observed_free: bool = False) -> int:
        """How many tokens of ``kind`` to draft at generated-token ``position``; 0 means a plain step.

        ``prior`` is the acceptance to assume for a kind not seen before; ``observed_free`` says the caller
        ``observe``s the kind during plain steps, so it needs no probing.
        """
        cap = min(self.max_draft, available)
        if cap <= 0:
            return 0
        if not self.adaptive:
            return cap
        c = self.costs
        if c.step_s is None or self.rounds_since_plain >= RECALIBRATE_ROUNDS:
            return 0  # a plain step measures the baseline
        state = self.kinds.setdefault(kind, KindState.with_prior(prior))
        k, speedup = self._best(state.acceptance, cap)
        if speedup >= 1.0:  # (during a pause only an observed kind's estimate can change)
            state.off_until, state.backoff, state.probe_next = 0, MIN_BACKOFF, False
            return k
        if observed_free or position < state.off_until or self._best(1.0, cap)[1] < 1.0:
            return 0  # observed for free, pausing, or too slow to pay even if every draft were kept
        if state.probe_next:
            state.probe_next = False
            return k
        state.off_until, state.probe_next = position + state.backoff, True
        state.backoff = min(2 * state.backoff, MAX_BACKOFF)
        return 0

    def _best(self, acceptance: float, cap: int) -> tuple[int, float]:
        c = self.costs
        extra_s = c.extra_s if c.extra_s is not None else PRIOR_EXTRA_FRACTION * c.step_s
        return best_draft_length(acceptance, cap, c.step_s, extra_s, c.draft_s or 0.0)

    def observe(self, kind: str, accepted: bool, prior: float = 0.5) -> None:
        """A proposal of ``kind`` that was not verified would (not) have been kept: plain decoding chose its token."""
        self.kinds.setdefault(kind, KindState.with_prior(prior)).observe(int(accepted), rejected=not accepted)

    def record_plain(self, seconds: float) -> None:
        """A plain decode step took ``seconds``."""
        self.costs.step_s = ewma(self.costs.step_s, seconds)
        self.rounds_since_plain = 0

    def record_round(self, kind: str, proposed: int, accepted: int, propose_s: float, verify_s: float,
                     caught_up: int = 0, prior: float = 0.5) -> None:
        """A round drafted ``proposed`` tokens of ``kind`` and the target kept ``accepted`` of them."""
        if proposed <= 0:
            raise ValueError("a round proposes at least one token")
        self.rounds_since_plain += 1
        self.kinds.setdefault(kind, KindState.with_prior(prior)).observe(accepted, rejected=accepted < proposed)
        c = self.costs
        if c.step_s is not None:
            c.extra_s = ewma(c.extra_s, max(0.0, verify_s - c.step_s) / proposed)
        if caught_up <= CATCH_UP_TOLERANCE:
            c.draft_s = ewma(c.draft_s, propose_s / proposed)
