"""Human names for models: a clean display name from a GGUF's ``general.name``, its repo id and its file name,
and the name of the model that wrote a stored reply.

No Qt here. ``general.name`` is whatever the converter wrote: often fine ("Qwen2.5 0.5B Instruct"), sometimes a
training run's label ("Smollm2 135M 8k Lc100K Mix1 Ep2") or a quantization that is not the file's ("... AWQ" on a
Q4_K_M file). It is kept when every word of it also appears in the file name or repo id; otherwise the repo id or
the file name, without its quantization tag, names the model.
"""

from __future__ import annotations

import re

# quantization formats and tags that describe a file, not the model ("AWQ" on a GGUF is the source's format)
_QUANT_WORDS = re.compile(
    r"^(?:gguf|awq|gptq|exl2|bnb|mlx|int[48]|[48]bit|fp16|fp32|bf16|f16|f32|"
    r"i?q[1-8](?:_[0-9a-z]+)*|tq[12]_0|mxfp4|nvfp4)$", re.IGNORECASE)
_SEPARATORS = re.compile(r"[\s\-]+|\.(?=[a-z]*q\d|[bf]f?\d\d)", re.IGNORECASE)
_UNINFORMATIVE = {"model", "ggml", "gguf", "file", "unnamed", ""}
MAX_NAME_CHARS = 80


def display_name(general_name: str | None, file_name: str | None = None, repo: str | None = None) -> str:
    """A clean human name for a model.

    Args:
        general_name: the GGUF's ``general.name`` (None or empty when absent).
        file_name: the GGUF's file name or path (``SmolLM2-135M-Instruct-Q8_0.gguf``).
        repo: the Hugging Face repo id it came from (``bartowski/SmolLM2-135M-Instruct-GGUF``), if known.

    Returns:
        ``general_name`` without quantization words when the file name or repo id agrees with it, else a name made
        from the repo id or the file name; "Unknown model" when there is nothing to go on.
    """
    named = _words(general_name or "")
    sources = [w for w in (_repo_words(repo), _file_words(file_name)) if w]
    known = {w.lower() for words in sources for w in _split_more(words)}
    if named and (not sources or all(w.lower() in known for w in _split_more(named))):
        return _join(named)
    for words in sources:
        if [w for w in words if w.lower() not in _UNINFORMATIVE]:
            return _join(words)
    return _join(named) if named else "Unknown model"


def _words(text: str) -> list[str]:
    """The words of a name, without quantization tags."""
    tokens = [w for w in _SEPARATORS.split(text.strip()) if w and not _QUANT_WORDS.match(w)]
    return [p for w in tokens for p in w.split("_") if p]


def _split_more(words: list[str]) -> list[str]:
    """Words split further at dots that do not join digits ("v1.5" stays), for comparing names."""
    return [p for w in words for p in re.split(r"(?<!\d)\.|\.(?!\d)", w) if p]


def _file_words(file_name: str | None) -> list[str]:
    if not file_name:
        return []
    stem = file_name.replace("\\", "/").rsplit("/", 1)[-1]
    stem = re.sub(r"(?i)\.gguf$", "", stem)
    stem = re.sub(r"(?i)-\d{5}-of-\d{5}$", "", stem)  # a split file's part number
    return _words(stem)


def _repo_words(repo: str | None) -> list[str]:
    if not repo:
        return []
    return _words(repo.rsplit("/", 1)[-1])


def _join(words: list[str]) -> str:
    name = " ".join(words)
    return name if len(name) <= MAX_NAME_CHARS else name[:MAX_NAME_CHARS - 1].rstrip() + "…"


def reply_author(stats: dict, fallback: str) -> str:
    """The name of the model that wrote a stored reply, from its stats; ``fallback`` for a reply without one
    (still streaming, or from before replies recorded their model)."""
    name = stats.get("model_name")
    if isinstance(name, str) and name.strip():  # (an imported reply's stats are kept as they came: one clean line)
        return _join(name.split())
    raw, file = stats.get("model"), stats.get("model_file")
    raw = raw if isinstance(raw, str) else None
    file = file if isinstance(file, str) else None
    return display_name(raw, file) if raw or file else fallback
