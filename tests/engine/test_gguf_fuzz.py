"""Seeded mutation fuzzing of the tiny model's header: every mutant opens cleanly or raises ModelFormatError.

Each case is named ``kind:index`` and rebuilt from that name alone, so a failure can be replayed:

    python -m tests.engine.test_gguf_fuzz --replay bit_flip:123     # re-raises with the full traceback
    python -m tests.engine.test_gguf_fuzz --cases 20000             # a longer run; prints outcomes and worst costs
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import re
import tempfile
from pathlib import Path
from typing import Callable

import gguf
import pytest

from engine.config import ModelConfig
from engine.gguf_file import ModelFormatError, read_gguf
from tests.engine.conftest import CaseGuard, tracing_memory
from tests.engine.gguf_builders import write_tiny_llama

CASES_PER_KIND = int(os.environ.get("HEARTH_FUZZ_CASES_PER_KIND", "250"))


class Target:
    """The tiny model's bytes, the end of its header, and the offsets of its structural fields.

    Structural fields are the single-number parts gguf-py's reader finds (lengths, counts, types, dims,
    offsets and scalar values); half the mutations aim at them, since flipping bits in token text
    rarely reaches a new code path.
    """

    def __init__(self, path: Path):
        self.data = path.read_bytes()
        reader = gguf.GGUFReader(path)
        self.header_end = reader.data_offset
        fields = list(reader.fields.values()) + [t.field for t in reader.tensors]
        self.structural = sorted({offset for f in fields for offset in _scalar_part_offsets(f)})

    def position(self, rng: random.Random) -> int:
        if rng.random() < 0.5:
            return min(rng.choice(self.structural) + rng.randrange(8), self.header_end - 1)
        return rng.randrange(self.header_end)


def _scalar_part_offsets(field: gguf.ReaderField) -> list[int]:
    offsets, pos = [], field.offset
    for part in field.parts:
        if part.size == 1 and part.itemsize >= 4:
            offsets.append(pos)
        pos += part.nbytes
    return offsets


# -- mutations: each takes the bytes, a seeded RNG and the target, and returns new bytes -------------------
def bit_flip(data: bytearray, rng: random.Random, t: Target) -> bytearray:
    data[t.position(rng)] ^= 1 << rng.randrange(8)
    return data


def set_bytes(value: Callable[[random.Random], int]) -> Callable[[bytearray, random.Random, Target], bytearray]:
    def mutate(data: bytearray, rng: random.Random, t: Target) -> bytearray:
        pos = t.position(rng)
        for i in range(pos, min(pos + rng.choice((1, 2, 4, 8)), len(data))):
            data[i] = value(rng)
        return data
    return mutate


def insert(data: bytearray, rng: random.Random, t: Target) -> bytearray:
    pos = t.position(rng)
    data[pos:pos] = rng.randbytes(rng.randint(1, 16))
    return data


def delete(data: bytearray, rng: random.Random, t: Target) -> bytearray:
    pos = t.position(rng)
    del data[pos:pos + rng.randint(1, 16)]
    return data


def truncate(data: bytearray, rng: random.Random, t: Target) -> bytearray:
    return data[:t.position(rng) if rng.random() < 0.8 else rng.randrange(len(data))]


def several(data: bytearray, rng: random.Random, t: Target) -> bytearray:
    for _ in range(rng.randint(2, 6)):
        data = rng.choice(SINGLE)(data, rng, t)
    return data


SINGLE = (bit_flip, set_bytes(lambda rng: 0), set_bytes(lambda rng: 0xFF), set_bytes(lambda rng: rng.randrange(256)),
          insert, delete)
MUTATIONS = {"bit_flip": bit_flip, "zero_bytes": SINGLE[1], "ff_bytes": SINGLE[2], "random_bytes": SINGLE[3],
             "insert": insert, "delete": delete, "truncate": truncate, "several": several}


def mutant(target: Target, case: str) -> bytes:
    """The file of case ``kind:index``; the same name always gives the same bytes."""
    kind = case.split(":")[0]
    return bytes(MUTATIONS[kind](bytearray(target.data), random.Random(case), target))


def open_and_use(path: Path) -> str:
    """What a loader does: open, read every tensor's bytes, build the config. Returns "ok" or the config's refusal."""
    with read_gguf(path) as f:
        for name, info in f.tensors.items():
            assert f.raw(name).nbytes == info.nbytes
        try:
            ModelConfig.from_gguf(f)
        except ModelFormatError as e:
            return f"opens; config refused: {e}"
    return "ok"


def run_case(guard: CaseGuard, target: Target, case: str, path: Path) -> str:
    """Run one case; returns its outcome class, or fails the test naming the case and how to replay it."""
    path.write_bytes(mutant(target, case))
    outcome = guard.run(f"case {case} (replay: python -m tests.engine.test_gguf_fuzz --replay {case})",
                        lambda: open_and_use(path))
    if outcome.error is None:
        return "config refused" if outcome.value.startswith("opens; config") else "opens"
    if not isinstance(outcome.error, ModelFormatError):
        pytest.fail(f"case {case}: {type(outcome.error).__name__}: {outcome.error} "
                    f"(replay: python -m tests.engine.test_gguf_fuzz --replay {case})", pytrace=False)
    return "refused: " + re.sub(r"[\d']+.*", "", str(outcome.error))[:40]


@pytest.fixture(scope="module")
def target(tiny_model_path: Path) -> Target:
    return Target(tiny_model_path)


@pytest.mark.parametrize("kind", MUTATIONS)
def test_mutants_open_or_raise_model_format_error(kind: str, target: Target, tmp_path: Path, case_guard: CaseGuard):
    path = tmp_path / "mutant.gguf"
    outcomes = collections.Counter(run_case(case_guard, target, f"{kind}:{i}", path) for i in range(CASES_PER_KIND))
    # a fuzzer that only ever meets one check is not exploring: require several distinct outcomes
    assert len(outcomes) >= 4, outcomes


def test_mutations_replay_exactly(target: Target):
    assert mutant(target, "several:7") == mutant(target, "several:7")
    assert mutant(target, "several:7") != mutant(target, "several:8")
    assert len({mutant(target, f"bit_flip:{i}") for i in range(50)}) > 45


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replay", help="one case, kind:index; its exception propagates")
    parser.add_argument("--cases", type=int, default=CASES_PER_KIND * len(MUTATIONS), help="cases in all (spread over kinds)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        target = Target(write_tiny_llama(Path(tmp) / "tiny.gguf"))
        path = Path(tmp) / "mutant.gguf"
        if args.replay:
            path.write_bytes(mutant(target, args.replay))
            print(open_and_use(path))
            return
        guard, outcomes = CaseGuard(), collections.Counter()
        with tracing_memory():
            for i in range(args.cases):
                outcomes[run_case(guard, target, f"{list(MUTATIONS)[i % len(MUTATIONS)]}:{i // len(MUTATIONS)}", path)] += 1
    for outcome, n in outcomes.most_common():
        print(f"{n:7d}  {outcome}")
    print(f"worst CPU    {guard.worst_cpu_seconds[0] * 1000:.1f} ms  ({guard.worst_cpu_seconds[1]})")
    print(f"worst wall   {guard.worst_seconds[0] * 1000:.1f} ms  ({guard.worst_seconds[1]})")
    print(f"worst memory {guard.worst_bytes[0] / 1024:.0f} KiB  ({guard.worst_bytes[1]})")


if __name__ == "__main__":
    main()
