"""The long-context bench (``bench --depth``) through its command line: every depth and engine reported, the ratios,
the peers' settings and the KV type reaching llama-bench. Structure only: nothing here checks a speed."""

from __future__ import annotations

import json
import stat

from tests.engine.bench_cli import bench, bench_json

SMALL = ("--threads", "1", "--prompt-tokens", "16", "--gen-tokens", "4", "--repeats", "2", "--json")


def test_every_depth_and_engine_is_reported_with_the_ratios(tiny_model_path):
    report = bench_json(tiny_model_path, "--backend", "cpu", "--depth", "40", "--depth", "300", "--compare",
                        "llama.cpp", *SMALL)
    assert set(report["depths"]) == {"40", "300"} and report["kv_type"] == "f16"
    for at in report["depths"].values():
        engines = at["engines"]
        assert set(engines) == {"hearth", "llama.cpp fa=off", "llama.cpp fa=on"}
        for e in engines.values():
            for phase in ("prefill_tps", "decode_tps"):
                rates = e[phase]
                assert len(rates["runs"]) == 2 and rates["min"] <= rates["median"] <= rates["max"] and rates["min"] > 0
            assert e["fill_s"] >= 0
        for phase in ("prefill", "decode"):
            best = at[f"peer.best_{phase}"]
            assert at[f"ratio.{phase}"] == at[f"ratio.{phase}.vs {best}"]
            mine = engines["hearth"][f"{phase}_tps"]["median"]
            assert at[f"ratio.{phase}.vs {best}"] == round(mine / engines[best][f"{phase}_tps"]["median"], 3)
        for name in ("llama.cpp fa=off", "llama.cpp fa=on"):
            divergence = engines[name]["first_divergence"]
            assert divergence is None or 0 <= divergence < 4


def test_llama_bench_gets_the_depth_and_the_cache_type(tiny_model_path, tmp_path):
    """A stand-in llama-bench records its arguments and prints a report of the shape the real one prints."""
    args_file, fake = tmp_path / "args.json", tmp_path / "llama-bench"
    tests = [{"flash_attn": 1, "n_prompt": 16, "n_gen": 0, "samples_ts": [100.0, 110.0]},
             {"flash_attn": 1, "n_prompt": 0, "n_gen": 4, "samples_ts": [20.0, 22.0]}]
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {args_file}\necho '{json.dumps(tests)}'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    report = bench_json(tiny_model_path, "--backend", "cpu", "--depth", "40", "--kv-type", "f32", "--compare",
                        "llama-bench", "--llama-bench", fake, *SMALL)
    args = args_file.read_text().split()
    assert args[args.index("-d") + 1] == "40" and args[args.index("-ctk") + 1] == args[args.index("-ctv") + 1] == "f32"
    assert args[args.index("-fa") + 1] == "0,1" and args[args.index("-r") + 1] == "2"
    at = report["depths"]["40"]
    assert at["engines"]["llama-bench fa=on"]["decode_tps"]["median"] == 21.0 and report["kv_type"] == "f32"
    assert at["peer.best_decode"] == "llama-bench fa=on"


def test_a_kv_type_the_model_cannot_take_is_a_clear_error(tiny_model_path):
    done = bench(tiny_model_path, "--backend", "cpu", "--depth", "40", "--kv-type", "q8_0", *SMALL)
    assert done.returncode == 2 and "multiples of 32" in done.stderr and "Traceback" not in done.stderr


def test_depth_takes_only_the_llama_cpp_peers(tiny_model_path):
    done = bench(tiny_model_path, "--depth", "40", "--compare", "hearth", *SMALL)
    assert done.returncode == 2 and "unknown peer 'hearth' with --depth" in done.stderr
