"""Speculative decoding: a draft model or prompt lookup proposes, the target verifies several tokens per pass.

The scheduler runs a sequence's speculation with ``Speculator.begin`` and one ``Speculator.decode`` per step
while the sequence decodes alone; ``Speculator.generate_step`` wraps both in the shape of
``engine.generate.generate_step``. Build one with ``draft_model_speculator`` or ``prompt_lookup_speculator``.
"""

from .adaptive import AdaptiveDraftLength
from .decode import (SpeculationStats, Speculator, draft_model_speculator, prompt_lookup_speculator, verify_greedy,
                     verify_sampled)
from .proposers import Candidate, DraftModel, PromptLookup, Proposal, Proposer
from .vocabulary import check_same_vocabulary

__all__ = [
    "AdaptiveDraftLength", "Candidate", "DraftModel", "PromptLookup", "Proposal", "Proposer", "SpeculationStats",
    "Speculator", "check_same_vocabulary", "draft_model_speculator", "prompt_lookup_speculator", "verify_greedy",
    "verify_sampled",
]
