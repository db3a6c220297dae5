"""The second peer: llama.cpp's own ``llama-bench`` binary, run on the same file and thread count, JSON parsed.

``llama-bench`` prefills ``-p`` tokens of its own (not our prompt ids) and decodes ``-n`` tokens, each as a
separate test after its own warm-up run; its figures are llama.cpp's best case, without any Python around it.
Its decode test starts from an empty cache unless ``-d`` fills one first: ``run_llama_bench_reply`` times the
decode after the prompt's positions (``-d P``), as a reply's decode follows its prompt in our runs.
The binary is found at ``--llama-bench PATH``, else ``$HEARTH_LLAMA_BENCH``, else where the test helpers
(``tests/llama_cpp_tools.py``) build it: ``<test-model cache>/llama-cpp-tools-<llama-cpp-python version>/bin``.
"""

from __future__ import annotations

import json
import os
import subprocess
from importlib import metadata
from pathlib import Path

import platformdirs

from .peer_check import describe_exit

FLASH_ATTN = {0: "off", 1: "on", -1: "auto"}


def default_binary() -> Path:
    """Where ``llama-bench`` is looked for when no path is given (it may not exist)."""
    if env := os.environ.get("HEARTH_LLAMA_BENCH"):
        return Path(env)
    cache = Path(os.environ.get("HEARTH_TEST_MODELS") or platformdirs.user_cache_dir("hearth-test-models"))
    return cache / f"llama-cpp-tools-{metadata.version('llama-cpp-python')}" / "bin" / "llama-bench"


def run_llama_bench(binary: Path, model: Path, prompt_tokens: int, gen_tokens: int, threads: int,
                    repetitions: int = 1, timeout_s: float = 3600, depth: int = 0, kv_type: str = "f16",
                    flash_attn: tuple[int, ...] = (0, 1)) -> dict[str, dict[str, list[float]]]:
    """One ``llama-bench -p P -n N -t T -fa 0,1 -o json -r R`` call; with ``depth`` (``-d``) both tests run after
    that many positions of context, and ``kv_type`` other than f16 is its ``-ctk`` and ``-ctv``.

    Returns:
        ``{"llama-bench fa=off": {"prefill_tps": [...], "decode_tps": [...]}, "llama-bench fa=on": {...}}``,
        one rate per repetition.

    Raises:
        FileNotFoundError: no binary at ``binary``.
        RuntimeError: the binary failed or printed something that is not its JSON report.
    """
    if not Path(binary).is_file():
        raise FileNotFoundError(f"no llama-bench binary at {binary} (build it with `python -m tests.llama_cpp_tools`, "
                                "or give --llama-bench PATH / $HEARTH_LLAMA_BENCH)")
    cmd = [str(binary), "-m", str(model), "-p", str(prompt_tokens), "-n", str(gen_tokens), "-t", str(threads),
           "-fa", ",".join(map(str, flash_attn)), "-r", str(repetitions), "-o", "json"]
    if depth:
        cmd += ["-d", str(depth)]
    if kv_type != "f16":
        cmd += ["-ctk", kv_type, "-ctv", kv_type]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({describe_exit(done.returncode)}): {done.stderr.strip()[-500:]}")
    return parse_report(done.stdout)


def run_llama_bench_reply(binary: Path, model: Path, prompt_tokens: int, gen_tokens: int, threads: int,
                          **options) -> dict[str, dict[str, list[float]]]:
    """A reply's two phases as our bench times them: ``-p P -n 0`` (the prompt into an empty cache), then
    ``-p 0 -n N -d P`` (the decode after the prompt's P positions, whose KV cache every step reads); without
    ``-d`` llama-bench would decode at positions 0 .. N - 1 and read a smaller cache than our decode does.
    Takes ``run_llama_bench``'s options (not ``depth``) and returns its mapping."""
    out = run_llama_bench(binary, model, prompt_tokens, 0, threads, **options)
    for name, rates in run_llama_bench(binary, model, 0, gen_tokens, threads, depth=prompt_tokens, **options).items():
        out.setdefault(name, {"prefill_tps": [], "decode_tps": []})["decode_tps"] += rates["decode_tps"]
    return out


def parse_report(text: str) -> dict[str, dict[str, list[float]]]:
    """Prefill and decode rates per flash-attention setting from ``llama-bench -o json`` output."""
    try:
        tests = json.loads(text)
    except json.JSONDecodeError as e:
        raise RuntimeError(f"llama-bench printed no JSON report: {e}") from None
    out: dict[str, dict[str, list[float]]] = {}
    for test in tests:
        fa = FLASH_ATTN.get(int(test["flash_attn"]), str(test["flash_attn"]))
        rates = out.setdefault(f"llama-bench fa={fa}", {"prefill_tps": [], "decode_tps": []})
        if test["n_prompt"] > 0 and test["n_gen"] == 0:
            rates["prefill_tps"] += [float(v) for v in test["samples_ts"]]
        elif test["n_gen"] > 0 and test["n_prompt"] == 0:
            rates["decode_tps"] += [float(v) for v in test["samples_ts"]]
    if not out:
        raise RuntimeError("llama-bench's JSON report holds no tests")
    return out
