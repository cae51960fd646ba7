"""Several sampled answers per prompt: more distinct training text from the same short prompts.

A greedy folder holds one answer per prompt, the target's own argmax path, and `train` keeps one example per
prompt across folders (a second greedy answer of the same prompt is the same text). A sampled folder holds
`answers` answers per prompt drawn at `temperature` (and `top_p`): example id `PROMPT#aJ` for answer J, drawn by
coupled sampling with a seed of the data seed, the prompt id and J, so an answer is the same in any batch and on
resume. Its labels are the target's sampled tokens, the distribution a server samples from at that temperature;
`train` keeps every distinct sampled answer (and one greedy answer per prompt).
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass

from ..errors import InputError
from .data import example_prompt_key

TAG = "#a"  # example id = prompt id + TAG + answer number


@dataclass(frozen=True)
class Answers:
    """How a folder answers each prompt: once greedily (temperature 0), or `count` times sampled."""

    count: int = 1
    temperature: float = 0.0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise InputError(f"`answers` must be a whole number >= 1, got {self.count!r}; pass --answers 1 or more")
        if not isinstance(self.temperature, (int, float)) or not 0 <= self.temperature <= 2:
            raise InputError(f"`temperature` must lie in [0, 2], got {self.temperature!r}; pass --temperature 0.8 "
                             "for sampled answers, or 0 for the greedy one")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise InputError(f"`top_p` must lie in (0, 1], got {self.top_p!r}; pass --top-p 0.95, or 1 for none")
        if self.count > 1 and self.temperature == 0:
            raise InputError(f"{self.count} answers per prompt need sampling: greedy decoding writes the same answer "
                             "each time; pass --temperature 0.8 (or --answers 1)")

    @property
    def sampled(self) -> bool:
        return self.temperature > 0

    def record(self) -> dict | None:
        """The folder setting `meta.json` records (None for greedy: folders written before it stay resumable)."""
        if not self.sampled:
            return None
        return {"answers": self.count, "temperature": float(self.temperature), "top_p": float(self.top_p),
                "seeds": "coupled sampling, seeded by the data seed, the prompt id and the answer number"}

    def describe(self) -> str:
        if not self.sampled:
            return "greedy (the target's own argmax)"
        return (f"sampled: {self.count} answer(s) per prompt at temperature {self.temperature:g}, top_p "
                f"{self.top_p:g} (coupled sampling, seeded per prompt and answer)")

    def expand(self, chosen: list[tuple[str, list[int]]]) -> list[tuple[str, list[int]]]:
        """[(prompt id, ids)] -> [(example id, ids)]: one item per answer to write."""
        if not self.sampled:
            return chosen
        return [(answer_id(prompt_id, j), ids) for prompt_id, ids in chosen for j in range(self.count)]


def answer_id(prompt_id: str, number: int) -> str:
    return f"{prompt_id}{TAG}{number}"


def is_sampled(example_id: str) -> bool:
    """Whether an example holds a sampled answer (its id ends in TAG and a number)."""
    head, tag, number = example_id.rpartition(TAG)
    return bool(tag) and bool(head) and number.isdigit()


def answer_seed(seed: int, example_id: str) -> int:
    """The sampling seed of one answer: the data seed and the example id (prompt id and answer number) hashed."""
    digest = hashlib.sha256(f"answer:{seed}:{example_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def example_key(example) -> bytes:
    """What `train` keeps once: the prompt of a greedy answer (another folder's greedy answer to the same prompt is
    the same text), the prompt and the answer of a sampled one or of a human answer with prefill labels (every
    distinct text is its own example)."""
    key = example_prompt_key(example)
    distinct = is_sampled(example.id) or getattr(example, "greedy", None) is not None
    return key if not distinct else key + b"/" + array("q", example.input_ids).tobytes()
