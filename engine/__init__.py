"""Hearth's inference engine: GGUF models, tokenizer, templates, sampling and generation, with no Qt."""

__version__ = "0.1.0"
