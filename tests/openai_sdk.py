"""The openai SDK's response models, built before several threads parse responses with them.

openai 3.x defers building its pydantic models until their first use (``defer_build``), and that build is not
thread-safe: threads that parse their first chunks at the same moment can find a class half built, its schema
falling through to ``BaseModel``'s placeholder ("BaseModel cannot be instantiated directly", or no
``__pydantic_core_schema__`` at all). It failed a fresh-clone CI run once (2026-11-29, seven streams in
``tests/engine/serve/test_greedy_identity.py``); eight threads parsing one chunk each, with a 1 µs switch interval,
fail in 11 processes of 12. Tests that call the SDK from several threads call ``build_sdk_models`` first.
"""

from __future__ import annotations

import functools

import openai.types.chat  # noqa: F401 - the chat and completion models the tests parse
import pydantic

MODULES = ("openai.types.chat", "openai.types.completion", "openai.types.shared")


def _subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub, *_subclasses(sub)}
    return found


@functools.cache
def build_sdk_models() -> int:
    """Build every deferred model of the SDK's chat and completion types now, once; how many were built."""
    deferred = [c for c in _subclasses(pydantic.BaseModel)
                if c.__module__.startswith(MODULES) and not c.__pydantic_complete__]
    for cls in deferred:
        cls.model_rebuild()
    return len(deferred)
