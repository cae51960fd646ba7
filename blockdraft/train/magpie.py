"""Magpie prompts: user prompts the target writes itself, for `blockdraft data --sets ...,magpie`.

Magpie (Xu et al. 2024, "Alignment Data Synthesis from Scratch by Prompting Aligned LLMs with Nothing"): given only
its chat template up to the start of a user turn, an instruction-tuned model writes what a user would ask. Each
candidate is sampled from that bare header (temperature 1, top-p 0.95) and ends at the end-of-turn token; the
candidates are screened (unfinished, empty, special tokens inside, too short, duplicates) and the survivors become
ordinary prompts whose responses the target regenerates greedily like any other. No benchmark text is involved.

Reproducible: candidate i is drawn with seed base(seed) + i by coupled sampling, whose draw depends on the seed
and the position only. `OUT/magpie.jsonl` keeps the candidates tried and the prompts kept, so a stopped run
continues where it stopped and a larger count extends the same list.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import InputError
from ..prompts import GENERATED_SETS, Prompt
from .data import write_atomically
from .shards import tokenizer_fingerprint

MAGPIE = GENERATED_SETS[0]
FILE = "magpie.jsonl"
FORMAT = "blockdraft-magpie-v1"
SENTINEL = "blockdraft magpie sentinel"  # a user message to cut the rendered template at
CANDIDATES_PER_PROMPT = 4  # give up after this many candidates per prompt asked for (a model that never ends)
SAVE_SECONDS = 30.0  # at most this much generation is redone after a stop
SKIPS = ("too_long", "empty", "special_token", "too_short", "duplicate")


@dataclass(frozen=True)
class MagpieSettings:
    """How candidates are drawn and screened: `max_tokens` is the most tokens a prompt may take (a candidate
    that has not ended its turn by then is dropped as too long); shorter than `min_chars` is too short. A batch runs
    until its longest candidate ends, so `max_tokens` bounds what a batch costs: at most 96 steps, where 256 made
    every batch of a small target run 256 (its sampled turns often ramble on); meta.json counts those dropped."""

    temperature: float = 1.0
    top_p: float = 0.95
    max_tokens: int = 96
    min_chars: int = 16


@dataclass
class MagpieState:
    """What `OUT/magpie.jsonl` holds: candidates 0..candidates-1 were tried; `prompts` are the (candidate index,
    text) kept, in index order; `skipped` counts the others by reason."""

    candidates: int = 0
    prompts: list[tuple[int, str]] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SKIPS, 0))


def user_turn_header(tokenizer) -> list[int]:
    """The token ids of the chat template up to where a user's first message begins (a default system prompt
    included, as the template writes it when none is given)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": SENTINEL}], tokenize=False)
    if SENTINEL not in text:
        raise InputError("the target's chat template does not write the user's message verbatim, so the user-turn "
                         "header for magpie prompts cannot be found; leave `magpie` out of --sets")
    header = tokenizer.encode(text[: text.index(SENTINEL)], add_special_tokens=False)
    whole = tokenizer.apply_chat_template([{"role": "user", "content": SENTINEL}], tokenize=True)
    whole = list(whole["input_ids"] if hasattr(whole, "keys") else whole)
    # The prompts are later encoded whole; a header tokenised otherwise would sample from a context never seen.
    if whole[: len(header)] != header:
        raise InputError("the target's tokenizer splits its user-turn header differently inside a conversation; "
                         "magpie prompts would start from a context the target never sees; leave `magpie` out")
    return header


def end_of_turn_ids(tokenizer) -> set[int]:
    """The special token the template writes right after a user's message (SmolLM2: <|im_end|>), if any."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": SENTINEL}], tokenize=False)
    after = tokenizer.encode(text[text.index(SENTINEL) + len(SENTINEL):], add_special_tokens=False)
    return {after[0]} if after and after[0] in special_ids(tokenizer) else set()


def special_ids(tokenizer) -> set[int]:
    added = getattr(tokenizer, "added_tokens_decoder", {})
    return set(tokenizer.all_special_ids) | {i for i, token in added.items() if getattr(token, "special", False)}


def screen(tokens: list[int], finish_reason: str, tokenizer, specials: set[int], settings: MagpieSettings,
           seen: set[str]) -> tuple[str | None, str]:
    """(the prompt's text, "kept") for a good candidate, else (None, why it is dropped: one of SKIPS).

    `tokens` end with the stop token when `finish_reason` is "stop". Kept texts join `seen` (normalised: case
    and runs of whitespace ignored), so a repeat is dropped.
    """
    if finish_reason != "stop":
        return None, "too_long"
    body = tokens[:-1]
    text = tokenizer.decode(body).strip()
    if not text:
        return None, "empty"
    if any(t in specials for t in body):  # e.g. a turn of its own opened inside the prompt
        return None, "special_token"
    if len(text) < settings.min_chars:
        return None, "too_short"
    key = " ".join(text.lower().split())
    if key in seen:
        return None, "duplicate"
    seen.add(key)
    return text, "kept"


def magpie_prompts(target, folder: str | Path, count: int, *, seed: int, batch_size: int,
                   settings: MagpieSettings = MagpieSettings(),
                   on_batch: Callable[[int, int], None] | None = None) -> tuple[list[Prompt], dict]:
    """The first `count` magpie prompts of `target` for `seed` (fewer when too many candidates fail), and a
    record of the candidates tried and dropped. Continues `folder/magpie.jsonl`, and keeps it current.

    `on_batch(candidates, kept)` reports progress after every batch of `batch_size` candidates.
    """
    from ..decode.decoder import Decoder
    from ..decode.requests import eos_ids
    from ..decode.options import DecodeOptions
    from ..sampling import SamplingParams

    tokenizer, path = target.tokenizer, Path(folder) / FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    header = user_turn_header(tokenizer)
    record = {"format": FORMAT, "target": target.name, "tokenizer": tokenizer_fingerprint(tokenizer),
              "header": header, "seed": seed, "settings": asdict(settings)}
    state = _load(path, record)
    decoder, specials = Decoder(target, None), special_ids(tokenizer)
    stops = eos_ids(target) | end_of_turn_ids(tokenizer)
    seen = {" ".join(text.lower().split()) for _, text in state.prompts}
    base, saved = _base_seed(seed), time.monotonic()
    while len(state.prompts) < count and state.candidates < CANDIDATES_PER_PROMPT * count:
        first = state.candidates
        # Row i of the batch is seeded base + first + i (Selector): candidate i's draw is the same in any batch.
        sampling = SamplingParams(settings.temperature, top_p=settings.top_p, seed=(base + first) % 2**64)
        results = decoder.generate([header] * batch_size, max_new_tokens=settings.max_tokens,
                                   options=DecodeOptions(sampling=sampling), stop_token_ids=stops)
        for index, result in enumerate(results, first):
            text, verdict = screen(result.tokens, result.finish_reason, tokenizer, specials, settings, seen)
            if text is None:
                state.skipped[verdict] += 1
            else:
                state.prompts.append((index, text))
        state.candidates += batch_size
        if time.monotonic() - saved > SAVE_SECONDS:
            _save(path, record, state)
            saved = time.monotonic()
        if on_batch is not None:
            on_batch(state.candidates, len(state.prompts))
    _save(path, record, state)
    prompts = [Prompt(str(index), ({"role": "user", "content": text},), MAGPIE) for index, text in state.prompts]
    stats = {"candidates": state.candidates, "kept": len(state.prompts), "skipped": dict(state.skipped)}
    return prompts[:count], stats


def _base_seed(seed: int) -> int:
    """A seed for candidate 0 derived from the data seed (apart from the seeds of other uses of `seed`)."""
    return int.from_bytes(hashlib.sha256(f"magpie:{seed}".encode()).digest()[:8], "little") >> 1


def _load(path: Path, record: dict) -> MagpieState:
    """The state saved in `path`, or a fresh one; a file written for another target or settings is refused."""
    if not path.exists():
        return MagpieState()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        head = json.loads(lines[0])
        prompts = [(int(line["id"]), str(line["prompt"])) for line in map(json.loads, lines[1:])]
        state = MagpieState(int(head["candidates"]), prompts, {k: int(head["skipped"][k]) for k in SKIPS})
    except (ValueError, KeyError, IndexError, TypeError) as error:
        raise InputError(f"{path} is not a magpie prompt file ({error}); delete it (its prompts are written "
                         "again) or write to a new --out folder") from error
    changed = sorted(key for key in record if head.get(key) != record[key])
    if changed:
        raise InputError(f"{path} holds magpie prompts of another {', '.join(changed)}; resume with the same target "
                         "and settings, or delete it (its prompts are written again) or use a new --out folder")
    return state


def _save(path: Path, record: dict, state: MagpieState) -> None:
    head = {**record, "candidates": state.candidates, "kept": len(state.prompts), "skipped": state.skipped}
    lines = [json.dumps(head)] + [json.dumps({"id": i, "prompt": text}) for i, text in state.prompts]
    write_atomically(path, "\n".join(lines) + "\n")
