"""The tests' guard against the openai SDK's thread-unsafe first build of its models (``tests/openai_sdk.py``): after
it, eight threads parsing their first chunk at once, with the interpreter switching threads every microsecond, all
succeed; without it they failed in 11 runs of 12."""

from __future__ import annotations

import subprocess
import sys

RACE = """
import sys, threading
sys.setswitchinterval(1e-6)
from openai._models import construct_type
from openai.types.chat import ChatCompletionChunk
from tests.openai_sdk import build_sdk_models
print(build_sdk_models())
chunk = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
         "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"}, "finish_reason": None}]}
barrier, errors = threading.Barrier(8), []
def parse():
    barrier.wait()
    try:
        assert construct_type(type_=ChatCompletionChunk, value=chunk).choices[0].delta.content == "hi"
    except Exception as e:
        errors.append(e)
threads = [threading.Thread(target=parse) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
print(len(errors), errors[:1])
"""


def test_eight_threads_parse_their_first_chunks_at_once_after_the_models_are_built():
    for _ in range(4):  # a fresh interpreter each time: the build happens once per process
        done = subprocess.run([sys.executable, "-c", RACE], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        built, failed = done.stdout.splitlines()
        assert int(built) > 20 and failed == "0 []"
