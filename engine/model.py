"""Model: a loaded GGUF model with its tokenizer, chat template and backend; the engine's public face."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .backends import create_backend
from .chat_template import ChatTemplate
from .config import ModelConfig
from .context import fit_messages
from .generate import GenerationEvent, generate_step, prefill, reusable_prefix, stream_generate
from .gguf_file import GGUFFile, read_gguf
from .memory_estimate import kv_cache_bytes
from .sampling import SamplingParams, make_sampler
from .scheduler import Request
from .session import Session, SessionError, load_session, save_session
from .tokenizer import IncrementalDecoder, Tokenizer

if TYPE_CHECKING:
    from .speculative import Speculator

DEFAULT_N_CTX = 4096
CHAT_PREFILL_CHUNK = 128  # small enough that Stop acts within a fraction of a second
KV_ELEMENT_BYTES = 4  # assumed when a backend's caches allocate nothing up front (float32)


@dataclasses.dataclass(frozen=True)
class KVCacheUsage:
    """How much of its KV cache the live sequence fills, and what the cache holds and may grow to."""

    used_positions: int  # positions filled
    max_positions: int  # n_ctx
    allocated_bytes: int  # held now; the cache grows in steps towards max_bytes
    bytes_per_position: int  # keys and values of one position in every layer
    max_bytes: int  # at max_positions (sliding-window layers stop growing at their window)


@dataclasses.dataclass(frozen=True)
class _Stream:
    prompt_len: int
    stop: tuple[str, ...]
    skip_special: bool


class Model:
    """A model ready to tokenize, render chats and generate.

    One sequence is kept alive between calls (its tokens and KV cache), so a follow-up prompt that
    starts with the previous one only processes the new tokens. Not thread-safe, except ``cancel``.
    """

    def __init__(self, gguf: GGUFFile, backend: str = "auto", n_ctx: int | None = None):
        self.gguf = gguf
        self.path = gguf.path
        self.config = ModelConfig.from_gguf(gguf)
        self.tokenizer = Tokenizer.from_gguf(gguf)
        self.notices: list[str] = []
        self.n_ctx = min(n_ctx or DEFAULT_N_CTX, self.config.n_ctx_train)
        self.backend, notice = create_backend(backend, gguf, self.config, self.n_ctx)
        if notice:
            self.notices.append(notice)
        bos = self.tokenizer.token_text(self.tokenizer.bos_id) if self.tokenizer.bos_id is not None else ""
        eos = self.tokenizer.token_text(self.tokenizer.eos_id) if self.tokenizer.eos_id is not None else ""
        self.template, notice = ChatTemplate.for_model(gguf.metadata, bos_token=bos, eos_token=eos)
        if notice:
            self.notices.append(notice)
        self._cache = None
        self._tokens: list[int] = []  # the tokens whose keys and values are in self._cache
        self._history: list[int] = []  # the whole sequence: self._tokens plus a last token not yet fed back
        self._stream: _Stream | None = None  # how the last generate_ids stream began, for continuation()
        self._sampler = None  # the last generation's sampler, whose state a snapshot keeps
        self._cancel = threading.Event()

    @property
    def name(self) -> str:
        return self.gguf.get("general.name", str, self.path.stem)

    @functools.cached_property
    def sha256(self) -> str:
        """The GGUF file's sha256: the model's identity in exports and snapshots."""
        digest = hashlib.sha256()
        with open(self.path, "rb") as f:
            while chunk := f.read(1 << 22):
                digest.update(chunk)
        return digest.hexdigest()

    @property
    def kv_cache_usage(self) -> KVCacheUsage:
        """The live sequence's KV cache use; read it on the thread that generates (the model is not thread-safe)."""
        cache, element = self._cache, self._kv_element_bytes
        return KVCacheUsage(used_positions=cache.n_past if cache is not None else 0, max_positions=self.n_ctx,
                            allocated_bytes=cache.nbytes if cache is not None else 0,
                            bytes_per_position=kv_cache_bytes(self.config, 1, element, False),
                            max_bytes=kv_cache_bytes(self.config, self.n_ctx, element, self.backend.kv_sliding_rings))

    @functools.cached_property
    def _kv_element_bytes(self) -> int:
        """Bytes per cached key/value element (2 for float16, 4 for float32), measured on a one-position cache
        from the backend; KV_ELEMENT_BYTES when such a cache allocates nothing up front."""
        probe = self.backend.new_cache(1)
        per_position, elements = probe.nbytes, kv_cache_bytes(self.config, 1, 1, False)
        return per_position // elements if per_position >= elements else KV_ELEMENT_BYTES

    # -- text ----------------------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of ``text`` with llama.cpp's semantics for BOS/EOS and special tokens."""
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)

    def render(self, messages: list[dict], add_generation_prompt: bool = True, **extra) -> str:
        """The chat template applied to ``messages`` (OpenAI-style role/content dicts)."""
        return self.template.render(messages, add_generation_prompt=add_generation_prompt, **extra)

    # -- compute -------------------------------------------------------------------------------------
    def next_token_logits(self, ids: Sequence[int]) -> np.ndarray:
        """float32 logits (n_vocab,) for the token after ``ids``, reusing the cached prefix."""
        cached = self._reuse_prefix(list(ids))
        logits = prefill(self.backend, self._cache, list(ids[cached:]) or [ids[-1]], 512)
        self._tokens, self._history, self._stream = list(ids), list(ids), None
        return logits

    def _reuse_prefix(self, ids: list[int]) -> int:
        """Keep the longest cached prefix of ``ids`` (at least one token is always recomputed)."""
        if not ids:
            raise ValueError("at least one token is needed")
        if len(ids) > self.n_ctx:
            raise ValueError(f"{len(ids)} tokens do not fit the context of {self.n_ctx}")
        if self._cache is None:
            self._cache = self.backend.new_cache(self.n_ctx)
        common = reusable_prefix(self._tokens, ids)
        self._cache.truncate(common)
        self._tokens = self._tokens[:common]
        return common

    def generate(self, prompt: str | Sequence[int], max_tokens: int = 64, temperature: float = 0.0,
                 top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, repeat_penalty: float = 1.0,
                 presence_penalty: float = 0.0, frequency_penalty: float = 0.0, seed: int | None = None,
                 stop: Sequence[str] = (), prefill_chunk: int = 512) -> Iterator[GenerationEvent]:
        """Stream tokens after ``prompt``.

        Args:
            prompt: text (tokenized with add_special=True, parse_special=True) or token ids.
            max_tokens: most tokens to generate.
            temperature: 0 for greedy decoding.
            top_k, top_p, min_p, repeat_penalty, presence_penalty, frequency_penalty: sampling filters.
            seed: sampler seed; the same seed gives the same output.
            stop: strings that end generation; they are not included in the text.
            prefill_chunk: tokens per prefill step (``cancel`` is checked between steps).

        Yields:
            One GenerationEvent per token; the last has ``finish_reason``.
        """
        ids = self.tokenize(prompt, add_special=True, parse_special=True) if isinstance(prompt, str) else list(prompt)
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                repeat_penalty=repeat_penalty, presence_penalty=presence_penalty,
                                frequency_penalty=frequency_penalty, seed=seed)
        yield from self.generate_ids(ids, params, max_tokens, stop, prefill_chunk)

    def generate_ids(self, ids: list[int], params: SamplingParams, max_tokens: int, stop: Sequence[str] = (),
                     prefill_chunk: int = 512, sampler_state: dict | None = None,
                     skip_special: bool = False, speculation: Speculator | None = None) -> Iterator[GenerationEvent]:
        """Like ``generate`` with a token prompt and ready-made sampling parameters.

        ``sampler_state`` (from a snapshot) continues a seeded sampler exactly where it stopped.
        ``skip_special`` leaves control tokens out of the event text (chat display) instead of writing them
        as llama.cpp's detokenizer does. ``speculation`` (engine.speculative) verifies several drafted tokens per
        target pass; greedy output is unchanged and sampled output keeps the target's distribution.
        """
        self._cancel.clear()
        cached = self._reuse_prefix(ids)
        self._history = list(ids)
        self._stream = _Stream(len(ids), tuple(stop), skip_special)
        self._sampler = make_sampler(params)
        if sampler_state is not None:
            self._sampler.set_state(sampler_state)
        device_greedy = getattr(self.backend, "greedy_step", None)  # MLX: argmax on the device, steps pipelined
        if speculation is not None:
            step = functools.partial(speculation.generate_step, params=params)
        elif device_greedy is not None and params.greedy and not params.penalises:
            step = lambda _backend, *args: device_greedy(*args)  # noqa: E731 - generate_step's signature
        else:
            step = generate_step
        try:
            for event in stream_generate(self.backend, self._cache, ids, cached, self._sampler,
                                         IncrementalDecoder(self.tokenizer, skip_special), self.tokenizer.eog_ids, max_tokens,
                                         stop, prefill_chunk, self._cancel, step):
                self._history.append(event.id)
                yield event
        finally:
            # the last token is not fed back, and a cancelled prefill leaves the cache short
            self._tokens = self._history[:self._cache.n_past]

    def chat(self, messages: list[dict], params: SamplingParams | None = None, max_tokens: int = 512,
             overflow: str = "drop_oldest", stop: Sequence[str] = (), prefill_chunk: int = CHAT_PREFILL_CHUNK,
             speculation: Speculator | None = None) -> tuple[int, Iterator[GenerationEvent]]:
        """Render ``messages`` with the chat template and stream the reply.

        Args:
            messages: role/content dicts, oldest first.
            params: sampling parameters (default: SamplingParams()).
            max_tokens: most tokens in the reply.
            overflow: "drop_oldest" keeps the system prompt and drops the oldest turns until the prompt fits
                with room for the reply; "stop" raises ContextOverflowError instead.
            stop: strings that end the reply.
            prefill_chunk: tokens per prefill step; ``cancel`` takes effect between steps.
            speculation: drafts tokens for the target to verify several at a time (see ``generate_ids``).

        Returns:
            How many messages were dropped to fit, and the event stream.
        """
        dropped, ids = self.fit_chat(messages, max_tokens, overflow)
        return dropped, self.generate_ids(ids, params or SamplingParams(), max_tokens, stop, prefill_chunk,
                                          skip_special=True, speculation=speculation)

    def fit_chat(self, messages: list[dict], max_tokens: int, overflow: str = "drop_oldest") -> tuple[int, list[int]]:
        """How many messages must be dropped (see ``chat``) for the prompt to leave room for the reply, and its ids."""
        reserve = min(max_tokens, self.n_ctx // 4)
        rendered: list[list[int]] = []

        def count(msgs: list[dict]) -> int:
            rendered.append(self.chat_ids(msgs))
            return len(rendered[-1])

        _, dropped = fit_messages(messages, count, self.n_ctx - reserve, overflow)
        return dropped, rendered[-1]  # fit_messages counts the list it returns last

    # -- several replies at once (engine.scheduler) ----------------------------------------------------
    def chat_request(self, messages: list[dict], params: SamplingParams, max_tokens: int, priority: int = 0,
                     overflow: str = "drop_oldest") -> tuple[int, Request]:
        """A chat reply as a scheduler Request on a cache of its own (this model's cache is left alone).

        Returns how many messages were dropped to fit, and the request."""
        dropped, ids = self.fit_chat(messages, max_tokens, overflow)
        return dropped, Request(tuple(ids), make_sampler(params), max_tokens, priority, frozenset(self.tokenizer.eog_ids),
                                decoder=IncrementalDecoder(self.tokenizer, skip_special=True))

    def continuation(self, max_tokens: int, priority: int = 0) -> Request:
        """The reply the last ``generate_ids`` stream was producing, as a scheduler Request that goes on in this
        model's cache: every token so far is its prompt (all but the last sampled one are cached), its sampler
        is the stream's (a seeded reply draws what it would have drawn), its decoder has seen the reply's tokens
        (a character split across the hand-over comes out whole). Close the stream first; the scheduler then owns
        the cache until the request ends, and ``settle`` records what it holds.

        Raises:
            ValueError: there is no stream to continue, or it had stop strings (their matcher's state stays behind).
        """
        stream = self._stream
        if stream is None or self._cache is None or len(self._history) <= stream.prompt_len:
            raise ValueError("no reply to continue: the last stream generated nothing")
        if stream.stop:
            raise ValueError("a stream with stop strings cannot be handed over")
        if self._cache.n_past >= len(self._history):  # a pipelined step fed the last token already: redo it
            self._cache.truncate(len(self._history) - 1)
        decoder = IncrementalDecoder(self.tokenizer, stream.skip_special)
        for token in self._history[stream.prompt_len:]:
            decoder.add(token)
        return Request(tuple(self._history), self._sampler, max_tokens, priority, frozenset(self.tokenizer.eog_ids),
                       decoder=decoder, cache=self._cache)

    def settle(self, sequence: Sequence[int]) -> None:
        """After a ``continuation`` ran under a scheduler: ``sequence`` is its prompt and every token it generated,
        of which this model's cache now holds the first ``n_past``; later replies reuse that prefix."""
        self._history = list(sequence)
        self._tokens = self._history[:self._cache.n_past]
        self._stream = None

    def chat_ids(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of the rendered conversation, with one BOS even when the template writes it too."""
        ids = self.tokenize(self.render(messages, add_generation_prompt=add_generation_prompt),
                            add_special=True, parse_special=True)
        bos = self.tokenizer.bos_id
        if bos is not None and len(ids) > 1 and ids[0] == bos and ids[1] == bos:
            ids = ids[1:]  # the tokenizer added BOS and the template wrote one (as Gemma's and Llama 3's do)
        return ids

    # -- snapshots -------------------------------------------------------------------------------------
    @property
    def sequence(self) -> list[int]:
        """Every token of the live sequence: the last prompt and what was generated after it."""
        return list(self._history)

    def save_session(self, path: str | os.PathLike, conversation=None) -> Session:
        """Snapshot the live sequence (tokens, KV cache, sampler state) and ``conversation`` to ``path``."""
        if self._cache is None or not self._history:
            raise SessionError("there is no conversation state to save yet")
        session = Session(tokens=list(self._history), kv=self._cache.export_state(), model_sha256=self.sha256,
                          model_name=self.name, backend=self.backend.name, n_ctx=self.n_ctx,
                          conversation=conversation,
                          sampler_state=self._sampler.get_state() if self._sampler is not None else None)
        save_session(path, session)
        return session

    def load_session(self, path: str | os.PathLike) -> Session:
        """Restore a snapshot into this model; the next generation continues where it stopped.

        Raises:
            SessionError: another model, a damaged file, wrong shapes or a context that is too small.
        """
        c = self.config
        session = load_session(path, self.sha256, c.n_layers, (c.n_kv_heads, c.head_dim, c.v_head_dim))
        if len(session.tokens) > self.n_ctx:
            raise SessionError(f"the session has {len(session.tokens)} tokens; this model's context is {self.n_ctx}")
        cache = self.backend.new_cache(self.n_ctx)
        cache.import_state(session.kv)
        self._cache, self._history, self._stream = cache, list(session.tokens), None
        self._tokens = self._history[:cache.n_past]
        return session

    def cancel(self) -> None:
        """Stop the running generation at the next token or prefill chunk (safe from any thread)."""
        self._cancel.set()

    def close(self) -> None:
        self.backend.close()
        self._cache = None
        self.gguf.close()


def load(path: str | os.PathLike, backend: str = "auto", n_ctx: int | None = None) -> Model:
    """Load a GGUF model.

    Args:
        path: the .gguf file.
        backend: "auto", "numpy", "cpu" or "mlx".
        n_ctx: context length in tokens (default 4096, capped at the model's training context).

    Raises:
        ModelFormatError: the file is not a valid or supported GGUF model.
        BackendUnavailableError: the requested backend cannot run here.
    """
    return Model(read_gguf(Path(path)), backend=backend, n_ctx=n_ctx)
