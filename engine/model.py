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
from .context import fit_messages, reply_room
from .deltanet import recurrent_state_bytes, recurrent_state_shapes
from .generate import GenerationEvent, prefill, reusable_prefix
from .gguf_file import GGUFFile, read_gguf
from .memory_estimate import kv_cache_bytes
from .reasoning import ReasoningProfile, thinking_stats
from .sampling import SamplingParams, make_sampler
from .scheduler import Request, RequestHandle, Scheduler
from .session import Session, SessionError, load_session, save_session
from .thermal.policy import Limits
from .tokenizer import IncrementalDecoder, Tokenizer

if TYPE_CHECKING:
    from .speculative import Speculator
    from .thermal.monitor import ThermalMonitor

DEFAULT_N_CTX = 4096
CHAT_PREFILL_CHUNK = 128  # small enough that Stop acts within a fraction of a second
KV_ELEMENT_BYTES = 4  # assumed when a backend's caches allocate nothing up front (float32)
# without a thermal monitor: each request's own prefill chunk applies, up to 8 sequences decode together, no rests
UNPACED = Limits(prefill_chunk=1 << 16, max_batch=8, pause_s=0.0, max_draft=1 << 16)


@dataclasses.dataclass(frozen=True)
class KVCacheUsage:
    """How much of its KV cache the live sequence fills, and what the cache holds and may grow to."""

    used_positions: int  # positions filled
    max_positions: int  # n_ctx
    allocated_bytes: int  # held now; the cache grows in steps towards max_bytes
    bytes_per_position: int  # keys and values of one position in every layer
    max_bytes: int  # at max_positions (sliding-window layers stop growing at their window)


class Model:
    """A model ready to tokenize, render chats and generate.

    Every reply is a request in the model's ``scheduler`` (``generate`` is a batch of one that the calling
    thread steps). One sequence's KV cache stays resident between replies (its tokens and cache), so a follow-up
    prompt that starts with the previous one only processes the new tokens; replies that run while it is in use
    get caches of their own. Not thread-safe, except ``cancel`` and the scheduler's ``submit``/``cancel``.
    """

    def __init__(self, gguf: GGUFFile, backend: str = "auto", n_ctx: int | None = None, kv_type: str | None = None):
        self.gguf = gguf
        self.path = gguf.path
        self.config = ModelConfig.from_gguf(gguf)
        self.tokenizer = Tokenizer.from_gguf(gguf)
        self.notices: list[str] = []
        self.n_ctx = min(n_ctx or DEFAULT_N_CTX, self.config.n_ctx_train)
        self.backend, notice = create_backend(backend, gguf, self.config, self.n_ctx, kv_type)
        if notice:
            self.notices.append(notice)
        bos = self.tokenizer.token_text(self.tokenizer.bos_id) if self.tokenizer.bos_id is not None else ""
        eos = self.tokenizer.token_text(self.tokenizer.eos_id) if self.tokenizer.eos_id is not None else ""
        self.template, notice = ChatTemplate.for_model(gguf.metadata, bos_token=bos, eos_token=eos)
        if notice:
            self.notices.append(notice)
        self._cache = None  # the resident sequence's KV cache
        self._tokens: list[int] = []  # the tokens whose keys and values are in self._cache
        self._history: list[int] = []  # the whole sequence: self._tokens plus a last token not yet fed back
        self._sampler = None  # the last resident generation's sampler, whose state a snapshot keeps
        self._resident: int | None = None  # the scheduler's id of the request running on self._cache
        self._cancel = threading.Event()
        self.scheduler = Scheduler(self.backend, self.n_ctx, limits=UNPACED)

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
    def _kv_element_bytes(self) -> float:
        """Bytes per cached key/value element (2 for float16, 4 for float32, 34 / 32 for q8_0), measured on a
        one-position cache from the backend; KV_ELEMENT_BYTES when such a cache allocates nothing up front."""
        probe = self.backend.new_cache(1)  # a hybrid model's cache also holds its (float32) recurrent states
        per_position = probe.nbytes - recurrent_state_bytes(self.config)
        elements = kv_cache_bytes(self.config, 1, 1, False)
        return per_position / elements if per_position >= elements else KV_ELEMENT_BYTES

    # -- text ----------------------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of ``text`` with llama.cpp's semantics for BOS/EOS and special tokens."""
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)

    def render(self, messages: list[dict], add_generation_prompt: bool = True, **extra) -> str:
        """The chat template applied to ``messages`` (OpenAI-style role/content dicts)."""
        return self.template.render(messages, add_generation_prompt=add_generation_prompt, **extra)

    @property
    def reasoning(self) -> ReasoningProfile:
        """How the chat template handles reasoning ("thinking"): syntax, ``enable_thinking`` switch."""
        return self.template.reasoning

    def thinking_stats(self, n_generated: int, sequence: Sequence[int] | None = None) -> dict:
        """``{"thinking_tokens": n}`` for a reply of ``n_generated`` tokens at the end of ``sequence`` (by default
        the live sequence); ``{}`` when the template has no reasoning syntax."""
        return thinking_stats(self.tokenizer, self.reasoning, self._history if sequence is None else sequence,
                              n_generated)

    # -- compute -------------------------------------------------------------------------------------
    def next_token_logits(self, ids: Sequence[int]) -> np.ndarray:
        """float32 logits (n_vocab,) for the token after ``ids``, reusing the cached prefix."""
        cached = self._reuse_prefix(list(ids))
        logits = prefill(self.backend, self._cache, list(ids[cached:]) or [ids[-1]], 512)
        self._tokens, self._history = list(ids), list(ids)
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
        try:
            self._cache.truncate(common)
        except ValueError:  # a cache that cannot go back there (a restored recurrent state): start afresh
            self._cache, common = self.backend.new_cache(self.n_ctx), 0
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
        """Like ``generate`` with a token prompt and ready-made sampling parameters: one request, stepped here.

        ``sampler_state`` (from a snapshot) continues a seeded sampler exactly where it stopped.
        ``skip_special`` leaves control tokens out of the event text (chat display) instead of writing them
        as llama.cpp's detokenizer does. ``speculation`` (engine.speculative) verifies several drafted tokens per
        target pass; greedy output is unchanged and sampled output keeps the target's distribution.

        Raises:
            ValueError: the prompt does not fit the context, or the backend refused it (a token id out of range).
        """
        if max_tokens <= 0:
            return
        self._cancel.clear()
        handle = self.submit(ids, params, max_tokens, stop, prefill_chunk=prefill_chunk, sampler_state=sampler_state,
                             skip_special=skip_special, speculation=speculation, cancel=self._cancel, queued=False)
        yield from self.stream(handle)

    def submit(self, ids: Sequence[int], params: SamplingParams, max_tokens: int, stop: Sequence[str] = (), *,
               prefill_chunk: int = 512, sampler_state: dict | None = None, skip_special: bool = False,
               speculation: Speculator | None = None, priority: int = 0, cancel: threading.Event | None = None,
               resident: bool = True, queued: bool = True) -> RequestHandle:
        """Queue a reply to ``ids`` in the scheduler; step it with ``stream`` or ``scheduler.step``.

        Args:
            ids: the prompt's token ids.
            params, max_tokens, stop, prefill_chunk, sampler_state, skip_special, speculation: as for
                ``generate_ids``.
            priority: higher decodes first when the thermal policy limits the sequences in flight.
            cancel: the reply's Stop flag, checked every token and between prefill chunks.
            resident: go on in the resident cache (reusing its prefix, and keeping the reply there for the next
                one) unless another reply uses it now; False gives the reply a cache of its own.
            queued: the handle queues the reply's events (readable from any thread); False for ``stream``, which
                reads them from the step reports.

        Raises:
            ValueError: the prompt does not fit the context, or ``max_tokens`` is not positive.
        """
        ids = list(ids)
        sampler = make_sampler(params)
        if sampler_state is not None:
            sampler.set_state(sampler_state)
        cache = on_finish = None
        if resident and self._resident is None:
            self._reuse_prefix(ids)
            cache, on_finish = self._cache, functools.partial(self._settle, sampler)
        elif len(ids) > self.n_ctx:
            raise ValueError(f"{len(ids)} tokens do not fit the context of {self.n_ctx}")
        request = Request(tuple(ids), sampler, max_tokens, priority, frozenset(self.tokenizer.eog_ids), tuple(stop),
                          IncrementalDecoder(self.tokenizer, skip_special), cache, prefill_chunk, params, speculation,
                          cancel, on_finish)
        handle = self.scheduler.submit(request, queued)
        if cache is not None:
            self._resident = handle.id
        return handle

    def stream(self, handle: RequestHandle) -> Iterator[GenerationEvent]:
        """Step the scheduler until ``handle``'s request ends, yielding its token events (sequences in flight
        beside it advance too). Closing the stream early ends the request.

        Raises:
            ValueError: the backend refused the prompt (the request "failed").
        """
        done, request_id = False, handle.id
        try:
            while not done:
                report = self.scheduler.step()
                if report.idle and not self.scheduler.has_work:
                    raise RuntimeError(f"request {request_id} is not in the scheduler")
                for rid, event in report.events:
                    if rid != request_id:
                        continue
                    if isinstance(event, GenerationEvent):
                        done = event.finish_reason is not None
                        yield event
                    else:
                        done = event.kind in ("cancelled", "failed")
                        if event.kind == "failed":
                            raise ValueError(event.detail)
        finally:
            if not done:
                self.scheduler.drop(handle.id)

    def _settle(self, sampler, history: list[int], cache) -> None:
        """The resident reply ended: its cache holds ``history[:cache.n_past]``, which later replies reuse."""
        self._history, self._sampler, self._resident = list(history), sampler, None
        if cache is not self._cache:  # dropped and rebuilt under recompute preemption
            self._cache = cache
        self._tokens = self._history[:cache.n_past] if cache is not None else []

    def set_monitor(self, monitor: ThermalMonitor | None) -> None:
        """The thermal monitor whose limits the scheduler applies each step (None: no thermal limits)."""
        self.scheduler.monitor = monitor

    def chat(self, messages: list[dict], params: SamplingParams | None = None, max_tokens: int = 512,
             overflow: str = "drop_oldest", stop: Sequence[str] = (), prefill_chunk: int = CHAT_PREFILL_CHUNK,
             speculation: Speculator | None = None,
             template_vars: dict | None = None) -> tuple[int, Iterator[GenerationEvent]]:
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
            template_vars: more chat-template variables, e.g. ``enable_thinking`` (templates ignore those they
                do not read).

        Returns:
            How many messages were dropped to fit, and the event stream.
        """
        dropped, ids = self.fit_chat(messages, max_tokens, overflow, template_vars)
        return dropped, self.generate_ids(ids, params or SamplingParams(), max_tokens, stop, prefill_chunk,
                                          skip_special=True, speculation=speculation)

    def fit_chat(self, messages: list[dict], max_tokens: int, overflow: str = "drop_oldest",
                 template_vars: dict | None = None) -> tuple[int, list[int]]:
        """How many messages must be dropped (see ``chat``) for the prompt to leave room for the reply, and its ids."""
        reserve = reply_room(self.n_ctx, max_tokens)
        rendered: list[list[int]] = []

        def count(msgs: list[dict]) -> int:
            rendered.append(self.chat_ids(msgs, template_vars=template_vars))
            return len(rendered[-1])

        _, dropped = fit_messages(messages, count, self.n_ctx - reserve, overflow, reply_room=reserve)
        return dropped, rendered[-1]  # fit_messages counts the list it returns last

    def start_chat(self, messages: list[dict], params: SamplingParams, max_tokens: int, *, priority: int = 0,
                   overflow: str = "drop_oldest", stop: Sequence[str] = (), prefill_chunk: int = CHAT_PREFILL_CHUNK,
                   speculation: Speculator | None = None, cancel: threading.Event | None = None,
                   template_vars: dict | None = None) -> tuple[int, RequestHandle]:
        """Submit a chat reply (see ``chat`` and ``submit``) for the caller to step; control tokens are left out
        of its text; ``template_vars`` go to the chat template (``enable_thinking``). Returns how many messages
        were dropped to fit, and the request's handle."""
        dropped, ids = self.fit_chat(messages, max_tokens, overflow, template_vars)
        return dropped, self.submit(ids, params, max_tokens, stop, prefill_chunk=prefill_chunk, skip_special=True,
                                    speculation=speculation, priority=priority, cancel=cancel)

    def chat_ids(self, messages: list[dict], add_generation_prompt: bool = True,
                 template_vars: dict | None = None) -> list[int]:
        """Token ids of the rendered conversation (``template_vars``: more template variables such as
        ``enable_thinking``), with one BOS even when the template writes it too."""
        text = self.render(messages, add_generation_prompt=add_generation_prompt, **(template_vars or {}))
        ids = self.tokenize(text, add_special=True, parse_special=True)
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
        session = load_session(path, self.sha256, c.n_layers, (c.n_kv_heads, c.head_dim, c.v_head_dim),
                               c.recurrent_layers, list(recurrent_state_shapes(c)) * len(c.recurrent_layers))
        if len(session.tokens) > self.n_ctx:
            raise SessionError(f"the session has {len(session.tokens)} tokens; this model's context is {self.n_ctx}")
        cache = self.backend.new_cache(self.n_ctx)
        cache.import_state(session.kv)
        self._cache, self._history = cache, list(session.tokens)
        self._tokens = self._history[:cache.n_past]
        return session

    def cancel(self) -> None:
        """Stop the running generation at the next token or prefill chunk (safe from any thread)."""
        self._cancel.set()

    def close(self) -> None:
        self.backend.close()
        self._cache = None
        self.gguf.close()


def load(path: str | os.PathLike, backend: str = "auto", n_ctx: int | None = None, kv_type: str | None = None) -> Model:
    """Load a GGUF model.

    Args:
        path: the .gguf file.
        backend: "auto", "numpy", "cpu" or "mlx".
        n_ctx: context length in tokens (default 4096, capped at the model's training context).
        kv_type: the KV cache's element type on the cpu backend: "f16" (its default), "f32" or "q8_0" (llama.cpp's
            8-bit blocks: 47 % less KV memory; see the README for its effect on parity). None: the backend's own.

    Raises:
        ModelFormatError: the file is not a valid or supported GGUF model.
        BackendUnavailableError: the requested backend cannot run here.
        ValueError: a ``kv_type`` the backend or the model cannot take.
    """
    return Model(read_gguf(Path(path)), backend=backend, n_ctx=n_ctx, kv_type=kv_type)
