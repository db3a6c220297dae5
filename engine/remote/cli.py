"""``python -m engine generate NAME --remote URL``: one reply from a remote endpoint's model, streamed."""

from __future__ import annotations

import json
import os
import sys
import threading

from .endpoint import Endpoint
from .model import RemoteModel


def endpoint_from_args(args) -> Endpoint:
    """The endpoint ``--remote``, ``--api-key-env``, ``--header`` and ``--allow-self-signed`` describe."""
    key = None
    if args.api_key_env:
        key = os.environ.get(args.api_key_env)
        if not key:
            raise ValueError(f"--api-key-env {args.api_key_env}: that environment variable is not set")
    headers = []
    for header in args.header:
        name, sep, value = header.partition(":")
        if not sep:
            raise ValueError(f"--header {header!r}: expected 'Name: value'")
        headers.append((name.strip(), value.strip()))
    return Endpoint(args.remote, key, tuple(headers), args.allow_self_signed,
                    stall_timeout_s=args.stall_timeout)


def cmd_generate_remote(args) -> int:
    """Stream a chat reply of model ``args.model`` (its id on the endpoint) to stdout; figures to stderr."""
    if sum(x is not None for x in (args.prompt, args.chat)) != 1 or args.load_session or args.save_session:
        raise ValueError("with --remote give exactly one of --prompt and --chat (sessions stay on the server)")
    model = RemoteModel(endpoint_from_args(args), str(args.model))
    messages = ([{"role": "system", "content": args.system}] if args.system else [])
    messages.append({"role": "user", "content": args.chat if args.chat is not None else args.prompt})
    sampling = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p, "min_p": args.min_p,
                "repeat_penalty": args.repeat_penalty, "seed": args.seed}
    if args.stop:
        sampling["stop"] = list(args.stop)
    handle = model.scheduler.submit(messages, args.max_tokens, sampling, threading.Event())
    text, last, failure = [], None, None
    try:
        while failure is None and (last is None or last.finish_reason is None):
            model.scheduler.step()
            for event in handle.ready():
                if getattr(event, "kind", None) == "failed":
                    failure = event.detail
                    break
                last = event
                text.append(event.text)
                if not args.json:
                    print(event.text, end="", flush=True)
    finally:
        model.close()
    stats = _stats(last)
    if args.json:
        print(json.dumps({"text": "".join(text), **stats, **({"error": failure} if failure else {})},
                         ensure_ascii=False))
    elif failure is None:
        print(f"\n[{stats['generated_tokens']} tokens, time to first token {stats['time_to_first_token_s']:.2f} s, "
              f"{stats['decode_tps']:.1f} tok/s, finish: {stats['finish_reason']}]", file=sys.stderr)
    if failure is not None:
        print(f"\nerror: {failure}", file=sys.stderr)
        return 1
    return 0


def _stats(event) -> dict:
    if event is None:
        return {"generated_tokens": 0, "prompt_tokens": 0, "time_to_first_token_s": 0.0, "decode_tps": 0.0,
                "finish_reason": None}
    return {"generated_tokens": event.generated_tokens, "prompt_tokens": event.prompt_tokens,
            "time_to_first_token_s": round(event.prefill_s, 4), "decode_tps": round(event.decode_tps, 2),
            "finish_reason": event.finish_reason}
