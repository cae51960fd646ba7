"""The bench's method names and what one method returns for one prompt (methods.py builds the methods)."""

from __future__ import annotations

from dataclasses import dataclass

from ..metrics import AcceptanceStats

PROMPT_LOOKUP_NUM_TOKENS = 10
BASELINE, HF_GENERATE, PROMPT_LOOKUP, SPECULATIVE, TREE, ADAPTIVE, LOOKUP, REFERENCE, LLAMA_CPP = (
    "ours-baseline", "hf-generate", "hf-prompt-lookup", "blockdraft", "blockdraft-tree", "blockdraft-adaptive",
    "blockdraft-lookup", "dflash-reference", "llama-cpp")
LLAMA_SERVER, LLAMA_DFLASH = "llama-cpp-server", "llama-cpp-dflash"
LOOKUP_ONLY = "blockdraft-lookup-only"
METHODS = (BASELINE, HF_GENERATE, PROMPT_LOOKUP, SPECULATIVE, TREE, ADAPTIVE, LOOKUP, LOOKUP_ONLY, REFERENCE,
           LLAMA_CPP, LLAMA_SERVER, LLAMA_DFLASH)
# our decode loop: coupled samples compare across these
OURS = (BASELINE, SPECULATIVE, TREE, ADAPTIVE, LOOKUP, LOOKUP_ONLY)
REQUIRED = (BASELINE, HF_GENERATE)  # every speedup is against these, and every output is checked against the first


@dataclass
class Decoded:
    tokens: list[int]  # new tokens of one prompt, before the runner's truncation
    stats: AcceptanceStats | None = None  # speculative methods only
