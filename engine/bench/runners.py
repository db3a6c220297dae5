"""The engines a speed bench times, each behind one small interface: ours through the scheduler (the path every
reply takes) and llama.cpp through llama-cpp-python, with flash attention on or off.

A run prefills the prompt ids, takes the greedy token, then decodes ``gen_tokens - 1`` more one at a time, and
returns the tokens with its prefill time (to the first token) and decode time (the tokens after it).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Protocol

import numpy as np

from ..model import Model
from ..sampling import SamplingParams, make_sampler
from ..sequence import Request
from ..tokenizer import IncrementalDecoder
from .peer_check import check_llama_cpp_runs

GREEDY = SamplingParams(temperature=0.0, repeat_penalty=1.0)  # plain argmax: the peer's job too
GGML_KV_TYPES = {"f16": 1, "f32": 0, "q8_0": 8}  # ggml_type ids of llama.cpp's -ctk / -ctv choices


@dataclasses.dataclass(frozen=True)
class Run:
    """One timed run: the greedy tokens (the first one from the prefill), prefill and decode seconds."""

    tokens: list[int]
    prefill_s: float
    decode_s: float

    def prefill_tps(self, prompt_tokens: int) -> float:
        return prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        return (len(self.tokens) - 1) / self.decode_s if self.decode_s > 0 else 0.0


class Runner(Protocol):
    """One engine under test."""

    name: str

    def run(self, ids: list[int], gen_tokens: int) -> Run: ...

    def close(self) -> None: ...


class HearthRunner:
    """Our engine as a reply runs: a greedy request in the model's scheduler, detokenized as it streams (no
    end-of-generation stop, so every run decodes ``gen_tokens``)."""

    def __init__(self, model: Model, name: str = "hearth"):
        self.name, self.model = name, model

    def run(self, ids: list[int], gen_tokens: int) -> Run:
        request = Request(tuple(ids), make_sampler(GREEDY), gen_tokens, decoder=IncrementalDecoder(self.model.tokenizer),
                          params=GREEDY)
        tokens: list[int] = []
        start = first_at = time.perf_counter()
        for event in self.model.stream(self.model.scheduler.submit(request, queued=False)):
            tokens.append(event.id)
            if len(tokens) == 1:
                first_at = time.perf_counter()
        return Run(tokens, first_at - start, time.perf_counter() - first_at)

    def close(self) -> None:
        pass


class LlamaCppRunner:
    """llama.cpp through llama-cpp-python on the same file, the same thread count and the same prompt ids."""

    def __init__(self, path: Path, n_ctx: int, threads: int, flash_attn: bool, kv_type: str = "f16"):
        check_llama_cpp_runs(Path(path))  # before this process loads it: a crash here would say nothing
        import llama_cpp  # a test and bench dependency: pip install .[bench]

        self.name = f"llama.cpp fa={'on' if flash_attn else 'off'}"
        self.flash_attn = flash_attn
        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                                   n_batch=512, n_ubatch=512, flash_attn=flash_attn, type_k=GGML_KV_TYPES[kv_type],
                                   type_v=GGML_KV_TYPES[kv_type], verbose=False)
        self._llama_cpp, self.n_vocab = llama_cpp, self.llm.n_vocab()

    def _greedy(self) -> int:
        # llama-cpp-python >= 0.3 no longer copies logits into Llama.scores unless logits_all is set
        logits = np.ctypeslib.as_array(self._llama_cpp.llama_get_logits_ith(self.llm.ctx, -1), shape=(self.n_vocab,))
        return int(np.argmax(logits))

    def run(self, ids: list[int], gen_tokens: int) -> Run:
        self.llm.reset()
        start = time.perf_counter()
        self.llm.eval(ids)
        tokens = [self._greedy()]
        first_at = time.perf_counter()
        for _ in range(gen_tokens - 1):
            self.llm.eval([tokens[-1]])
            tokens.append(self._greedy())
        return Run(tokens, first_at - start, time.perf_counter() - first_at)

    def close(self) -> None:
        self.llm.close()
