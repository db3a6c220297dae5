"""Can a draft model speculate for a target? Only if a token id means the same thing to both."""

from __future__ import annotations

from ..config import ModelConfig
from ..tokenizer import Tokenizer


def check_same_vocabulary(target: Tokenizer, target_config: ModelConfig, draft: Tokenizer,
                          draft_config: ModelConfig) -> None:
    """Check that the draft's token ids are the target's: same logit width, special ids and every token's text.

    All ids are compared (a 262k vocabulary takes a fraction of a second), not a sample: one differing id
    would make the draft propose a token that means something else to the target.

    Raises:
        ValueError: naming the first difference found.
    """
    if target_config.n_vocab != draft_config.n_vocab or target.n_vocab != draft.n_vocab:
        raise ValueError(f"the draft model's vocabulary has {draft.n_vocab} tokens ({draft_config.n_vocab} logits), "
                         f"the target's {target.n_vocab} ({target_config.n_vocab} logits); speculation needs the same "
                         "vocabulary")
    specials = (("BOS id", target.bos_id, draft.bos_id), ("EOS id", target.eos_id, draft.eos_id),
                ("end-of-generation ids", target.eog_ids, draft.eog_ids))
    for name, mine, theirs in specials:
        if mine != theirs:
            raise ValueError(f"the draft model's {name} is {theirs}, the target's {mine}; speculation needs the "
                             "same special tokens")
    for tid in range(target.n_vocab):
        if target.token_text(tid) != draft.token_text(tid):
            raise ValueError(f"token {tid} is {draft.token_text(tid)!r} to the draft model but "
                             f"{target.token_text(tid)!r} to the target; speculation needs the same vocabulary")
