"""The prefix cache on a fake cache: longest common prefix wins, too-small caches and short prefixes are skipped."""

from __future__ import annotations

from engine.serve.prefix_cache import PrefixCache


class FakeCache:
    def __init__(self, n_ctx: int, n_past: int):
        self.n_ctx, self.n_past = n_ctx, n_past

    def truncate(self, n_past: int) -> None:
        if n_past > self.n_past:
            raise ValueError("cannot grow")
        self.n_past = n_past


def test_the_longest_shared_prefix_is_taken_and_cut_back():
    pool = PrefixCache(capacity=3, min_tokens=4)
    short, long_ = FakeCache(100, 10), FakeCache(100, 20)
    pool.put(list(range(10)), short)
    pool.put(list(range(20)), long_)
    taken = pool.take(list(range(15)) + [99], positions=50)
    assert taken is long_ and taken.n_past == 15 and len(pool) == 1
    assert pool.take([7] * 30, positions=50) is None  # nothing shared


def test_small_caches_short_prefixes_and_capacity():
    pool = PrefixCache(capacity=2, min_tokens=4)
    pool.put(list(range(10)), FakeCache(12, 10))
    assert pool.take(list(range(10)) + [5], positions=40) is None  # cannot hold the new request
    assert pool.take([0, 1, 2, 9, 9], positions=5) is None  # shares 3 < min_tokens
    pool.put([1, 2], FakeCache(100, 2))  # too short to keep
    for i in range(3):
        pool.put([i] * 10, FakeCache(100, 10))
    assert len(pool) == 2
    assert pool.take([0] * 11, positions=20) is None  # the oldest went


def test_cached_tokens_in_usage_are_the_prompt_tokens_the_prefix_cache_held(live_server):
    import openai

    from engine.generate import reusable_prefix
    from .conftest import MODEL_NAME

    client = openai.OpenAI(base_url=live_server.base_url + "/v1", api_key="none", max_retries=0, timeout=120)
    shared = "You are a careful assistant for the harbour office of Port Vell. " * 6

    def ask(question: str):
        reply = client.completions.create(model=MODEL_NAME, prompt=shared + question, max_tokens=4, temperature=0,
                                          extra_body={"return_token_ids": True})
        return reply.usage, reply.choices[0].model_extra

    first_usage, first = ask("When does the ferry leave?")
    second_usage, second = ask("Where is the lighthouse?")
    held = first["prompt_token_ids"] + first["token_ids"][:-1]  # what the first request's cache holds at its end
    expected = reusable_prefix(held, second["prompt_token_ids"])
    assert expected > 60  # the shared instructions
    assert second_usage.prompt_tokens_details.cached_tokens == expected
    assert second_usage.prompt_tokens == len(second["prompt_token_ids"])
    assert first_usage.prompt_tokens_details.cached_tokens < expected  # nothing held it before (shorter prefixes)
