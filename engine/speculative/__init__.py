"""Speculative decoding: a draft model or prompt lookup proposes, the target verifies several tokens per pass.

``Speculator.generate_step`` has the shape of ``engine.generate.generate_step``; build one with
``draft_model_speculator`` or ``prompt_lookup_speculator``.
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
