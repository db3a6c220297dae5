"""Speculative decoding: the rejection rule (exact and empirical), n-gram lookup, the adaptive controller,
greedy output identical to plain decoding (tiny and real models, every backend) and the sampled distribution."""

from __future__ import annotations

import math

import numpy as np
import pytest

import engine.model
from engine.generate import generate_step
from engine.sampling import SamplingParams, make_sampler
from engine.speculative import (DraftModel, PromptLookup, Speculator, check_same_vocabulary,
                                draft_model_speculator, prompt_lookup_speculator)
from engine.speculative.adaptive import (MAX_BACKOFF, MIN_BACKOFF, RECALIBRATE_ROUNDS, AdaptiveDraftLength,
                                         expected_speedup, expected_tokens)
from engine.speculative.lookup import NgramIndex, NgramMatch
from engine.speculative.rejection import (acceptance_probability, draw, point_mass, residual_distribution,
                                          sampling_distribution, verify_drafted)
from tests.engine.gguf_builders import tiny_vocab, write_tiny_llama
from tests.model_store import model_path

GREEDY = SamplingParams(temperature=0.0)
# the tiny random model repeats one token under plain greedy decoding; penalties make its output varied
VARIED = SamplingParams(temperature=0.0, repeat_penalty=1.0, frequency_penalty=0.3, repeat_last_n=24)
VARIED_PRESENCE = SamplingParams(temperature=0.0, repeat_penalty=1.0, presence_penalty=1.0, repeat_last_n=6)

COPY_FUNCTION = '''def summarize_orders(orders, currency="EUR"):
    """Group orders by customer and return totals, counts and the largest order."""
    totals = {}
    counts = {}
    largest = {}
    for order in orders:
        customer = order["customer"].strip().lower()
        amount = float(order["amount"])
        if order.get("currency", currency) != currency:
            rate = order.get("rate")
            if rate is None:
                raise ValueError(f"order {order['id']} has no exchange rate")
            amount = amount * float(rate)
        if amount < 0:
            raise ValueError(f"order {order['id']} has a negative amount")
        totals[customer] = totals.get(customer, 0.0) + amount
        counts[customer] = counts.get(customer, 0) + 1
        if amount > largest.get(customer, (None, -1.0))[1]:
            largest[customer] = (order["id"], amount)
    report = []
    for customer in sorted(totals):
        average = totals[customer] / counts[customer]
        report.append({
            "customer": customer,
            "total": round(totals[customer], 2),
            "orders": counts[customer],
            "average": round(average, 2),
            "largest_order": largest[customer][0],
            "currency": currency,
        })
    report.sort(key=lambda row: row["total"], reverse=True)
    return report


def print_report(report):
    for row in report:
        print(f"{row['customer']:<20} {row['total']:>10.2f} {row['currency']}")
        print(f"    orders: {row['orders']}, average: {row['average']:.2f}")
        print(f"    largest order: {row['largest_order']}")
'''
COPY_PROMPT = "Repeat this code exactly, with the function summarize_orders renamed to customer_totals:\n\n" + COPY_FUNCTION
STORY_PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


# -- the rule, on hand-made distributions ------------------------------------------------------------------

def rule_output_distribution(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """What one verified position emits, analytically: kept drafts plus residual draws after rejections."""
    kept = np.array([q[x] * acceptance_probability(p, q, x) if q[x] > 0 else 0.0 for x in range(p.size)])
    return kept + (1.0 - kept.sum()) * residual_distribution(p, q)


HAND_MADE = [  # (p, q): overlap, disjoint support, equal, a point mass, q wider than p
    ([0.5, 0.3, 0.2, 0.0], [0.25, 0.5, 0.0, 0.25]),
    ([0.7, 0.3, 0.0, 0.0], [0.0, 0.0, 0.6, 0.4]),
    ([0.1, 0.2, 0.3, 0.4], [0.1, 0.2, 0.3, 0.4]),
    ([0.1, 0.6, 0.3, 0.0], [0.0, 0.0, 1.0, 0.0]),
    ([0.0, 1.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]),
]


def test_acceptance_and_residual_on_a_hand_made_pair():
    p, q = np.array([0.5, 0.3, 0.2, 0.0]), np.array([0.25, 0.5, 0.0, 0.25])
    assert acceptance_probability(p, q, 0) == 1.0  # p > q: always kept
    assert acceptance_probability(p, q, 1) == pytest.approx(0.6)  # kept with p / q
    assert acceptance_probability(p, q, 3) == 0.0  # the target never samples it
    np.testing.assert_allclose(residual_distribution(p, q), np.array([0.25, 0.0, 0.2, 0.0]) / 0.45)


def test_a_token_the_draft_could_not_have_drawn_is_an_error():
    with pytest.raises(ValueError, match="probability 0 under the draft"):
        acceptance_probability(np.array([0.5, 0.5]), np.array([1.0, 0.0]), 1)


@pytest.mark.parametrize("p, q", HAND_MADE)
def test_the_rule_emits_exactly_the_target_distribution(p, q):
    p, q = np.array(p), np.array(q)
    np.testing.assert_allclose(rule_output_distribution(p, q), p, atol=1e-12)


def test_dropping_the_residual_would_be_caught():
    # the check above is not vacuous: resampling from p itself after a rejection gives another distribution
    p, q = np.array([0.5, 0.3, 0.2, 0.0]), np.array([0.25, 0.5, 0.0, 0.25])
    kept = np.array([q[x] * acceptance_probability(p, q, x) if q[x] else 0.0 for x in range(4)])
    assert np.abs(kept + (1 - kept.sum()) * p - p).max() > 0.05


def chi_square_critical(dof: int, z: float = 3.719) -> float:
    """The chi-square quantile at the normal quantile ``z`` (Wilson-Hilferty; z = 3.719 is p = 1e-4)."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Pearson's statistic over cells with positive probability, and its degrees of freedom; counts in
    zero-probability cells are returned as an infinite statistic."""
    n = counts.sum()
    if counts[probs == 0].any():
        return math.inf, 1
    alive = probs > 0
    expected = n * probs[alive]
    return float(((counts[alive] - expected) ** 2 / expected).sum()), int(alive.sum()) - 1


@pytest.mark.parametrize("p, q", HAND_MADE)
def test_verify_drafted_samples_the_target_distribution(p, q):
    p, q = np.array(p), np.array(q)
    rng = np.random.default_rng(1234)
    counts = np.zeros(p.size)
    for _ in range(20_000):
        drafted = draw(q, rng.random())
        counts[verify_drafted(p, q, drafted, rng)[1]] += 1
    stat, dof = chi_square(counts, p)
    assert stat < chi_square_critical(max(dof, 1)), (counts, p)


def test_draw_follows_the_cumulative_distribution_and_skips_empty_tokens():
    probs = np.array([0.0, 0.25, 0.0, 0.75, 0.0])
    assert draw(probs, 0.0) == 1 and draw(probs, 0.2499) == 1 and draw(probs, 0.25) == 3
    assert draw(probs, np.nextafter(1.0, 0.0)) == 3


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.8, seed=1),
    SamplingParams(temperature=1.3, top_k=0, top_p=0.9, min_p=0.0, repeat_penalty=1.0, seed=2),
    SamplingParams(temperature=0.5, top_k=7, top_p=1.0, min_p=0.2, repeat_penalty=1.5, presence_penalty=0.5,
                   frequency_penalty=0.3, seed=3),
])
def test_sampling_distribution_is_what_the_sampler_draws_from(params):
    rng = np.random.default_rng(7)
    sampler = make_sampler(params)
    for _ in range(300):
        logits = (rng.standard_normal(500) * 3).astype(np.float32)
        history = list(rng.integers(0, 500, 80))
        p = sampling_distribution(logits, history, params)
        token, logprob = sampler(logits, history)
        assert p[token] > 0 and math.log(p[token]) == pytest.approx(logprob, abs=1e-5)
        assert p.sum() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="greedy"):
        sampling_distribution(logits, history, GREEDY)


def test_point_mass_proposals_accept_with_the_target_probability():
    p = np.array([0.2, 0.5, 0.3])
    q = point_mass(1, 3)
    assert acceptance_probability(p, q, 1) == 0.5
    np.testing.assert_allclose(residual_distribution(p, q), [0.4, 0.0, 0.6])


# -- n-gram lookup -----------------------------------------------------------------------------------------

def test_lookup_prefers_the_longest_then_the_most_recent_match():
    index = NgramIndex(ngram_max=3)
    index.reset([1, 2, 3, 9, 2, 3, 8, 5, 2, 3])
    assert index.find() == NgramMatch(2, 4)  # "2 3" occurred at 1 and 4; "5 2 3" never
    assert index.continuation(index.find(), 6) == [8, 5, 2, 3, 8, 5]  # then repeats with the match's period
    index.extend([8])
    assert index.find() == NgramMatch(3, 4)  # now "2 3 8" matches, longer than "3 8" or "8"


def test_the_tail_never_matches_itself_and_nothing_matches_fresh_tokens():
    index = NgramIndex(ngram_max=3)
    index.reset([4, 5, 6])
    assert index.find() is None
    index.extend([4])
    assert index.find() == NgramMatch(1, 0) and index.continuation(index.find(), 5) == [5, 6, 4, 5, 6]


def test_incremental_indexing_equals_indexing_at_once():
    rng = np.random.default_rng(3)
    tokens = list(rng.integers(0, 6, 200))
    whole, grown = NgramIndex(), NgramIndex()
    grown.reset(tokens[:5])
    for i in range(5, len(tokens)):
        grown.extend(tokens[i:i + 1])
        whole.reset(tokens[:i + 1])
        assert grown.find() == whole.find()


def test_prompt_lookup_proposes_what_followed_and_names_the_ngram_length():
    lookup = PromptLookup()
    history = [10, 11, 12, 13, 14, 15, 20, 11, 12]
    lookup.begin(history, 64, 512)
    assert lookup.candidate(history).kind == "ngram2"
    proposal = lookup.propose(history, 3, GREEDY, np.random.default_rng())
    assert proposal.tokens == (13, 14, 15) and proposal.q is None


def test_ngram_sizes_are_checked():
    with pytest.raises(ValueError):
        NgramIndex(ngram_max=2, ngram_min=3)


# -- the adaptive controller -------------------------------------------------------------------------------

def test_expected_tokens_and_speedup():
    assert expected_tokens(0.0, 4) == 1.0 and expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert expected_speedup(0.5, 2, step_s=1.0, extra_s=0.25, draft_s=0.0) == pytest.approx(1.75 / 1.5)


def test_first_step_is_plain_then_high_acceptance_drafts_long():
    c = AdaptiveDraftLength(max_draft=8)
    assert c.draft_length("draft", 100, 0) == 0  # no baseline yet: a plain step measures it
    c.record_plain(0.05)
    for _ in range(10):
        c.record_round("draft", 4, 4, propose_s=0.004, verify_s=0.05 + 4 * 0.005)
    assert c.draft_length("draft", 100, 10) == 8
    assert c.draft_length("draft", 3, 10) == 3  # never more than the proposer offers


def test_expensive_verification_or_poor_acceptance_switches_off_and_reprobes_with_backoff():
    c = AdaptiveDraftLength(max_draft=8)
    c.record_plain(0.05)
    for _ in range(10):
        c.record_round("ngram1", 2, 0, propose_s=0.0, verify_s=0.08)
    assert c.draft_length("ngram1", 10, 100) == 0  # switched off
    assert all(c.draft_length("ngram1", 10, pos) == 0 for pos in range(100, 100 + MIN_BACKOFF))
    assert c.draft_length("ngram1", 10, 100 + MIN_BACKOFF) >= 1  # the re-probe
    c.record_round("ngram1", 1, 0, propose_s=0.0, verify_s=0.065)
    assert c.draft_length("ngram1", 10, 101 + MIN_BACKOFF) == 0
    assert c.kinds["ngram1"].off_until == 101 + 3 * MIN_BACKOFF  # the pause doubled
    assert c.draft_length("ngram3", 10, 101 + MIN_BACKOFF) >= 1  # another kind is judged on its own


def test_backoff_is_bounded_and_resets_when_speculation_pays_again():
    c = AdaptiveDraftLength(max_draft=8)
    c.record_plain(0.05)
    pos = 0
    for _ in range(12):
        c.record_round("draft", 3, 0, propose_s=0.0, verify_s=0.1)
        while c.draft_length("draft", 10, pos) == 0:
            pos += 1
    assert c.kinds["draft"].backoff == MAX_BACKOFF
    for _ in range(40):
        c.record_round("draft", 3, 3, propose_s=0.0, verify_s=0.055)
        c.record_plain(0.05)
    assert c.draft_length("draft", 10, pos + 1) > 0 and c.kinds["draft"].backoff == MIN_BACKOFF


def test_max_draft_caps_and_zero_switches_off():
    c = AdaptiveDraftLength(max_draft=8)
    c.record_plain(0.05)
    for _ in range(10):
        c.record_round("draft", 8, 8, propose_s=0.0, verify_s=0.06)
    c.max_draft = 2
    assert c.draft_length("draft", 100, 0) == 2
    c.max_draft = 0
    assert c.draft_length("draft", 100, 0) == 0


def test_a_plain_step_recalibrates_the_baseline_regularly():
    c = AdaptiveDraftLength(max_draft=4)
    c.record_plain(0.05)
    for _ in range(RECALIBRATE_ROUNDS):
        assert c.draft_length("draft", 100, 0) > 0
        c.record_round("draft", 4, 4, propose_s=0.0, verify_s=0.06)
    assert c.draft_length("draft", 100, 0) == 0
    c.record_plain(0.05)
    assert c.draft_length("draft", 100, 0) > 0


def test_a_free_kind_is_never_probed_but_observing_it_switches_it_back_on():
    c = AdaptiveDraftLength(max_draft=8)
    c.record_plain(0.05)
    for _ in range(10):
        c.observe("ngram2", accepted=False)
    assert all(c.draft_length("ngram2", 10, pos, observed_free=True) == 0 for pos in range(200))
    for _ in range(8):  # the text starts copying: plain steps keep choosing the proposed token
        c.observe("ngram2", accepted=True)
    assert c.draft_length("ngram2", 10, 200, observed_free=True) > 1


def test_a_draft_too_slow_to_pay_even_when_always_right_is_not_probed():
    c = AdaptiveDraftLength(max_draft=8)
    c.record_plain(0.05)
    c.record_round("draft", 4, 4, propose_s=4 * 0.05, verify_s=0.07)  # the draft costs a whole target step
    assert all(c.draft_length("draft", 10, pos) == 0 for pos in range(300))
    c.begin()  # a new generation measures the draft's cost again
    assert c.draft_length("draft", 10, 0) > 0


def test_fixed_draft_length_without_adaptation():
    c = AdaptiveDraftLength(max_draft=5, adaptive=False)
    assert c.draft_length("ngram1", 100, 0) == 5 and c.draft_length("ngram1", 2, 0) == 2


# -- the generator on a tiny model -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory, tiny_model_path):
    """A tiny target and a tiny draft with other weights (same vocabulary), so drafts are often rejected."""
    draft_path = write_tiny_llama(tmp_path_factory.mktemp("draft") / "draft.gguf", seed=5, n_layers=1)
    target = engine.model.load(tiny_model_path, backend="numpy", n_ctx=512)
    draft = engine.model.load(draft_path, backend="numpy", n_ctx=512)
    yield target, draft
    target.close()
    draft.close()


def run_steps(model, prompt, params, n, spec=None, n_ctx=512):
    """(tokens, logprobs, cache) of the first ``n`` tokens of plain decoding, or of ``spec``'s (fewer if it ends)."""
    cache = model.backend.new_cache(n_ctx)
    args = (model.backend, cache, list(prompt), make_sampler(params), list(prompt))
    steps = generate_step(*args) if spec is None else spec.generate_step(*args, params=params)
    out = [pair for _, pair in zip(range(n), steps)]
    steps.close()
    return [t for t, _ in out], [lp for _, lp in out], cache


REPEATING_PROMPT = [40, 41, 42, 43, 44, 45, 46, 47, 40, 41, 42, 43, 44, 45, 46, 47, 40, 41, 42]


@pytest.mark.parametrize("method", ["lookup", "draft"])
@pytest.mark.parametrize("params", [GREEDY, VARIED, VARIED_PRESENCE])
@pytest.mark.parametrize("max_draft, adaptive", [(1, False), (4, False), (8, True)])
def test_greedy_output_is_plain_greedy_output(tiny_pair, method, params, max_draft, adaptive):
    target, draft = tiny_pair
    spec = (prompt_lookup_speculator(max_draft, adaptive) if method == "lookup"
            else draft_model_speculator(target, draft, max_draft, adaptive))
    plain, plain_lp, _ = run_steps(target, REPEATING_PROMPT, params, 60)
    ours, ours_lp, _ = run_steps(target, REPEATING_PROMPT, params, 60, spec)
    assert ours == plain
    np.testing.assert_allclose(ours_lp, plain_lp, atol=1e-4)
    s = spec.stats  # the first token, then each round's accepted drafts plus one; the last round may be cut short
    assert 60 <= 1 + s.plain_steps + s.verify_passes + s.accepted <= 60 + max_draft
    # the prompt repeats, so drafts are proposed and verified whether or not the controller adapts
    assert s.verify_passes > 0 and 0 <= s.accepted <= s.proposed


def test_the_draft_rounds_both_accept_and_reject_on_the_tiny_pair(tiny_pair):
    # the identity tests above would be weak if every draft were accepted (or none): check both happen
    target, draft = tiny_pair
    spec = draft_model_speculator(target, draft, 4, adaptive=False)
    run_steps(target, REPEATING_PROMPT, VARIED, 60, spec)
    assert 0 < spec.stats.accepted < spec.stats.proposed
    spec = prompt_lookup_speculator(4, adaptive=False)
    run_steps(target, REPEATING_PROMPT, VARIED, 60, spec)
    assert 0 < spec.stats.accepted < spec.stats.proposed


@pytest.mark.parametrize("stop_after", [1, 2, 5, 13])
def test_stopping_mid_round_leaves_the_cache_as_plain_decoding_does(tiny_pair, stop_after):
    target, draft = tiny_pair
    spec = prompt_lookup_speculator(8, adaptive=False)
    tokens, _, cache = run_steps(target, REPEATING_PROMPT, VARIED, stop_after, spec)
    assert cache.n_past == len(REPEATING_PROMPT) + stop_after - 1
    plain, _, plain_cache = run_steps(target, REPEATING_PROMPT, VARIED, stop_after)
    assert tokens == plain
    for ours, plain in zip(cache.export_state().keys, plain_cache.export_state().keys):
        np.testing.assert_allclose(ours, plain, atol=1e-5)


def test_the_end_of_the_context_is_reached_exactly_as_in_plain_decoding(tiny_pair):
    target, draft = tiny_pair
    n_ctx = len(REPEATING_PROMPT) + 23
    plain, _, plain_cache = run_steps(target, REPEATING_PROMPT, VARIED, 100, n_ctx=n_ctx)
    for spec in (prompt_lookup_speculator(8, adaptive=False), draft_model_speculator(target, draft, 8, False)):
        ours, _, cache = run_steps(target, REPEATING_PROMPT, VARIED, 100, spec, n_ctx=n_ctx)
        assert ours == plain and len(plain) == n_ctx - len(REPEATING_PROMPT) + 1
        assert cache.n_past == plain_cache.n_past == n_ctx


def test_model_generate_ids_with_speculation_keeps_stops_lengths_and_text(tiny_pair):
    target, draft = tiny_pair
    plain = list(target.generate_ids(REPEATING_PROMPT, GREEDY, 30))
    text = "".join(e.text for e in plain)
    stop = text[len(text) // 2:len(text) // 2 + 2]
    assert stop.strip(), "the tiny model produced whitespace only; pick other prompt ids"
    plain_stopped = list(target.generate_ids(REPEATING_PROMPT, GREEDY, 30, stop=[stop]))
    for spec in (prompt_lookup_speculator(6, adaptive=False), draft_model_speculator(target, draft, 3, False)):
        events = list(target.generate_ids(REPEATING_PROMPT, GREEDY, 30, speculation=spec))
        assert [(e.id, e.text, e.finish_reason) for e in events] == [(e.id, e.text, e.finish_reason) for e in plain]
        stopped = list(target.generate_ids(REPEATING_PROMPT, GREEDY, 30, stop=[stop], speculation=spec))
        assert [(e.id, e.text, e.finish_reason) for e in stopped] == \
            [(e.id, e.text, e.finish_reason) for e in plain_stopped]
        assert stopped[-1].finish_reason == "stop"
        # the model's live sequence is consistent: a follow-up reuses the prefix and continues as plain does
        follow_up = target.sequence + [50, 51]
        with_spec = [e.id for e in target.generate_ids(follow_up, GREEDY, 10, speculation=spec)]
        assert with_spec == [e.id for e in target.generate_ids(follow_up, GREEDY, 10)]


def test_max_draft_zero_is_plain_decoding(tiny_pair):
    target, _ = tiny_pair
    spec = prompt_lookup_speculator(8)
    spec.max_draft = 0
    plain, _, _ = run_steps(target, REPEATING_PROMPT, GREEDY, 20)
    ours, _, _ = run_steps(target, REPEATING_PROMPT, GREEDY, 20, spec)
    assert ours == plain and spec.stats.verify_passes == 0 and spec.stats.plain_steps == 19
    with pytest.raises(ValueError):
        spec.max_draft = -1


# -- vocabulary checks ----------------------------------------------------------------------------------------

def test_a_draft_with_a_different_token_text_is_refused(tmp_path, tiny_pair):
    target, _ = tiny_pair
    tokens, _, _ = tiny_vocab()
    renamed = list(tokens)
    renamed[100] = renamed[100] + "x"
    other = engine.model.load(write_tiny_llama(tmp_path / "other.gguf", metadata={"tokenizer.ggml.tokens": renamed}),
                              backend="numpy")
    with pytest.raises(ValueError, match="token 100 is"):
        draft_model_speculator(target, other)


def test_a_draft_with_other_special_tokens_is_refused(tmp_path, tiny_pair):
    target, _ = tiny_pair
    tokens, _, _ = tiny_vocab()
    path = write_tiny_llama(tmp_path / "other.gguf",
                            metadata={"tokenizer.ggml.eos_token_id": tokens.index("<|endoftext|>")})
    other = engine.model.load(path, backend="numpy")
    with pytest.raises(ValueError, match="EOS id"):
        check_same_vocabulary(target.tokenizer, target.config, other.tokenizer, other.config)


# -- the sampled distribution, end to end -------------------------------------------------------------------

SAMPLED = dict(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0, repeat_penalty=1.8, repeat_last_n=8)


def exact_joint(model, prompt, params, depth):
    """The exact distribution of the first ``depth`` sampled tokens of plain decoding, as {tuple: prob}."""
    joint = {(): 1.0}
    for _ in range(depth):
        nxt = {}
        for prefix, prob in joint.items():
            ids = list(prompt) + list(prefix)
            logits = model.backend.forward(ids, model.backend.new_cache(len(ids) + 1))
            p = sampling_distribution(logits, ids, params)
            for tok in np.flatnonzero(p):
                nxt[prefix + (int(tok),)] = prob * p[tok]
        joint = nxt
    return joint


@pytest.mark.slow
@pytest.mark.parametrize("method", ["draft", "lookup"])
def test_sampled_speculation_draws_from_the_target_distribution(tiny_pair, method):
    """3,000 seeded runs; the joint distribution of the first three tokens against the exact one computed from
    the target alone. The first comes from the plain sampler, the next two from a verify round (K=3) or, when
    lookup has nothing to propose, plain steps. Penalties make each position depend on those before it."""
    target, draft = tiny_pair
    prompt, runs = REPEATING_PROMPT, 3000
    cells = exact_joint(target, prompt, SamplingParams(**SAMPLED), 3)
    keys = sorted(cells)
    probs = np.array([cells[k] for k in keys])
    counts = np.zeros(len(keys))
    spec = (draft_model_speculator(target, draft, 3, adaptive=False) if method == "draft"
            else prompt_lookup_speculator(3, adaptive=False))
    cache = target.backend.new_cache(64)
    target.backend.forward(prompt, cache)
    proposed = accepted = passes = 0
    for seed in range(runs):
        params = SamplingParams(**SAMPLED, seed=seed)
        cache.truncate(len(prompt) - 1)
        steps = spec.generate_step(target.backend, cache, prompt[-1:], make_sampler(params), list(prompt),
                                   params=params)
        counts[keys.index(tuple(t for t, _ in (next(steps) for _ in range(3))))] += 1
        steps.close()
        s = spec.stats
        proposed, accepted, passes = proposed + s.proposed, accepted + s.accepted, passes + s.verify_passes
    stat, dof = chi_square(counts, probs)
    assert stat < chi_square_critical(dof), (stat, dof)
    assert passes > runs / 2 and 0.1 < accepted / proposed < 0.9  # the rule ran, and both ways


# -- real models: greedy output unchanged, on every backend ----------------------------------------------------

REAL_MODELS = ["smollm2", "gemma3", "qwen25coder"]


@pytest.fixture(scope="module")
def real_model():
    """``real_model(name, backend)``: a loaded test model, shared by the tests of this module."""
    loaded = {}

    def get(name: str, backend: str) -> engine.model.Model:
        if (name, backend) not in loaded:
            loaded[name, backend] = engine.model.load(model_path(name), backend=backend, n_ctx=1024)
        return loaded[name, backend]

    yield get
    for model in loaded.values():
        model.close()


def assert_greedy_unchanged(target, draft, n_tokens, prompts=(COPY_PROMPT, STORY_PROMPT)):
    """Plain greedy decoding and both kinds of speculation agree token for token on each prompt."""
    for prompt in prompts:
        ids = target.chat_ids([{"role": "user", "content": prompt}])
        plain, _, _ = run_steps(target, ids, GREEDY, n_tokens, n_ctx=1024)
        for spec in (prompt_lookup_speculator(8, adaptive=False), draft_model_speculator(target, draft, 4, False)):
            ours, _, _ = run_steps(target, ids, GREEDY, n_tokens, spec, n_ctx=1024)
            assert ours == plain, (target.name, target.backend.name, type(spec.proposer).__name__,
                                   target.detokenize(plain), target.detokenize(ours))
            assert spec.stats.verify_passes > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL_MODELS)
def test_real_model_greedy_output_is_unchanged(real_model, name):
    # each model drafts for itself (no smaller sibling with the same vocabulary among the test models)
    assert_greedy_unchanged(real_model(name, "cpu"), real_model(name, "cpu"), 64)


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL_MODELS)
def test_real_model_greedy_output_is_unchanged_on_numpy(real_model, name):
    # the reference decoder is slow: the short prompt only; the draft runs on the CPU backend
    assert_greedy_unchanged(real_model(name, "numpy"), real_model(name, "cpu"), 20, (STORY_PROMPT,))


@pytest.mark.slow
@pytest.mark.mlx
@pytest.mark.parametrize("name", REAL_MODELS)
def test_real_model_greedy_output_is_unchanged_on_mlx(real_model, name):
    # MLX's CPU device (Linux) takes about a second per Qwen token: the short prompt only
    assert_greedy_unchanged(real_model(name, "mlx"), real_model(name, "mlx"), 12, (STORY_PROMPT,))


@pytest.mark.slow
def test_verify_rows_are_exactly_decode_steps_on_the_cpu_backend(real_model):
    """What greedy identity rests on: a K+1-row verify pass gives each row bit for bit the logits (and stores
    the keys) a decode step would. Quantized activations turn any rounding difference into a visible one."""
    model = real_model("qwen25coder", "cpu")
    ids = model.tokenize(COPY_FUNCTION[:300], add_special=False)
    drafted = model.tokenize(" the quick brown fox jumps over", add_special=False)
    stepped, verified = model.backend.new_cache(1024), model.backend.new_cache(1024)
    model.backend.forward(ids, stepped)
    model.backend.forward(ids, verified)
    rows = model.backend.forward(drafted, verified, all_logits=True)
    for j, token in enumerate(drafted):
        np.testing.assert_array_equal(model.backend.forward([token], stepped), rows[j])


@pytest.mark.slow
def test_lookup_on_a_copy_prompt_drafts_most_of_the_answer(real_model):
    """Fixed draft length: adaptive lengths follow measured times, which a loaded machine sways (the controller has
    its own tests above, on given durations). Qwen first writes a sentence of its own, then copies the code."""
    model = real_model("qwen25coder", "cpu")
    ids = model.chat_ids([{"role": "user", "content": COPY_PROMPT}])
    spec = prompt_lookup_speculator(4, adaptive=False)
    plain, _, _ = run_steps(model, ids, GREEDY, 200, n_ctx=1024)
    ours, _, _ = run_steps(model, ids, GREEDY, 200, spec, n_ctx=1024)
    assert ours == plain
    assert spec.stats.accepted > 0.5 * len(plain) and spec.stats.tokens_per_verify > 2.5, spec.stats


@pytest.mark.slow
def test_models_with_different_vocabularies_cannot_pair(real_model):
    with pytest.raises(ValueError, match="vocabulary has 151936 tokens"):
        draft_model_speculator(real_model("smollm2", "cpu"), real_model("qwen25coder", "cpu"))
