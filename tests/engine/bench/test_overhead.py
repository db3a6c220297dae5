"""The host-overhead bench (``bench MODEL --sampling greedy|chat``) through its command line: Model.generate's
decode beside the bare forward on the same ids, the overhead's median and spread, the sampling it used.
Structure and arithmetic only: nothing here checks a speed."""

from __future__ import annotations

import statistics

import pytest

from engine.sampling import SamplingParams
from tests.engine.bench_cli import bench, bench_json
from tests.model_store import model_path

SMALL = ("--threads", "1", "--prompt-tokens", "20", "--gen-tokens", "7", "--repeats", "3", "--json")


def _check_spread(rates: dict, runs: int, positive: bool = True) -> None:
    assert len(rates["runs"]) == runs and (not positive or all(r > 0 for r in rates["runs"]))
    assert rates["min"] == min(rates["runs"]) and rates["max"] == max(rates["runs"])
    assert rates["median"] == pytest.approx(statistics.median(rates["runs"]), abs=0.011)


def _check_report(report: dict, mode: str, repeats: int, n_vocab: int) -> None:
    assert report["sampling"] == mode and report["repeats"] == repeats and report["n_vocab"] == n_vocab
    _check_spread(report["generate_decode_tps"], repeats)
    _check_spread(report["forward_decode_tps"], repeats)
    _check_spread(report["overhead_pct"], repeats, positive=False)
    _check_spread(report["overhead_pct_of_median_steps"], repeats, positive=False)
    assert 1 <= report["decode_steps"] < report["gen_tokens"] and report["same_tokens_every_run"] is True
    for pct, gen, bare in zip(report["overhead_pct"]["runs"], report["generate_decode_tps"]["runs"],
                              report["forward_decode_tps"]["runs"]):
        assert pct == pytest.approx((bare / gen - 1) * 100, abs=0.05 + abs(pct) * 0.01)  # same steps in both
    assert 0 < report["host_ms_per_token"] and 0 < report["sampler_ms"] and 0 < report["forward_ms_per_token"]
    assert report["host_pct_of_forward"] == pytest.approx(
        report["host_ms_per_token"] / report["forward_ms_per_token"] * 100, rel=2e-3, abs=2e-3)
    assert report["machine"]["logical_cpus"] >= 1


def test_greedy_is_plain_argmax(tiny_model_path):
    report = bench_json(tiny_model_path, "--sampling", "greedy", *SMALL)
    _check_report(report, "greedy", 3, report["n_vocab"])
    params = report["sampling_params"]
    assert params["temperature"] == 0.0 and params["repeat_penalty"] == 1.0
    assert report["decode_steps"] == 6  # greedy never stops early here: the tiny model draws no end token


def test_chat_uses_the_engines_default_sampling(tiny_model_path):
    report = bench_json(tiny_model_path, "--sampling", "chat", *SMALL)
    _check_report(report, "chat", 3, report["n_vocab"])
    defaults = SamplingParams()
    for name in ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n",
                 "presence_penalty", "frequency_penalty"):
        assert report["sampling_params"][name] == getattr(defaults, name), name
    assert report["sampling_params"]["seed"] is not None  # seeded: every pair decodes the same ids


def test_chat_with_top_k_off_overrides_only_the_fields_given(tiny_model_path):
    report = bench_json(tiny_model_path, "--sampling", "chat", "--top-k", "0", "--min-p", "0.1", *SMALL)
    _check_report(report, "chat", 3, report["n_vocab"])
    defaults = SamplingParams()
    assert report["sampling_params"]["top_k"] == 0 and report["sampling_params"]["min_p"] == 0.1
    for name in ("temperature", "top_p", "repeat_penalty", "repeat_last_n"):
        assert report["sampling_params"][name] == getattr(defaults, name), name


@pytest.mark.parametrize("args, message", [
    (("--top-k", "0", "--json"), "--top-k needs --sampling"),
    (("--sampling", "chat", "--top-p", "2", "--json"), "top_p must be between"),
])
def test_sampling_overrides_without_a_mode_or_out_of_range_are_refused(tiny_model_path, args, message):
    done = bench(tiny_model_path, *args)
    assert done.returncode == 2 and message in done.stderr


def test_an_unknown_sampling_mode_is_refused(tiny_model_path):
    done = bench(tiny_model_path, "--sampling", "creative", "--json")
    assert done.returncode == 2 and "invalid choice" in done.stderr


@pytest.mark.slow
def test_chat_sampling_on_the_152k_vocabulary_of_qwen25_coder():
    report = bench_json(model_path("qwen25coder"), "--sampling", "chat", "--threads", "2", "--prompt-tokens", "64",
                        "--gen-tokens", "9", "--repeats", "2", "--json")
    _check_report(report, "chat", 2, 151_936)


@pytest.mark.slow
def test_chat_sampling_with_top_k_off_on_the_152k_vocabulary_of_qwen25_coder():
    report = bench_json(model_path("qwen25coder"), "--sampling", "chat", "--top-k", "0", "--threads", "2",
                        "--prompt-tokens", "64", "--gen-tokens", "9", "--repeats", "2", "--json")
    _check_report(report, "chat", 2, 151_936)
    assert report["sampling_params"]["top_k"] == 0
