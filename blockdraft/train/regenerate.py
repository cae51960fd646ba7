"""`blockdraft data`: regenerate every training response with the target (batched, with progress).

Each prompt gets the target's greedy answer, or with `answers` (answers.py) several sampled ones.

Resumable: a folder that already holds shards of the same settings keeps them; the prompts they cover are
skipped and new shards continue the numbering. A larger `count` with the same seed selects a superset of
the prompts (the seeded order is fixed, and magpie prompts continue their list), so a stopped run can be
resumed and a finished one grown. Shards and meta.json are written whole or not at all, so a run stopped at
any moment leaves a usable folder.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from ..decode.decoder import Decoder
from ..errors import InputError
from ..prompts import training_prompts
from .answers import Answers, answer_seed
from .data import (held_prompts, make_example, read_examples, select_prompts, shard_files, write_atomically,
                   write_shard)
from .magpie import MAGPIE, MagpieSettings, magpie_prompts
from .shards import MAX_SHARD_BYTES, ShardSizer, tokenizer_fingerprint


def build_dataset(target, out: str | Path, *, sets, count: int, max_prompt_tokens: int = 384,
                  max_new_tokens: int = 256, batch_size: int = 64, shard_size: int = 2048, seed: int = 0,
                  magpie_fraction: float = 0.25, max_shard_bytes: int = MAX_SHARD_BYTES, skip_held=(),
                  answers: Answers = Answers()) -> dict:
    """Write data-*.safetensors shards and meta.json under `out`; returns the meta record.

    With `magpie` among `sets`, round(magpie_fraction * count) of the prompts are magpie prompts (all of them
    when it is the only set) and the rest come from the other sets. Prompts that the data folders `skip_held`
    hold already are passed over and do not count (meta.json: skipped, held_elsewhere), so that a folder grown
    beside another adds only prompts the other lacks. `answers`: the greedy answer (the default) or several
    sampled ones per prompt (answers.py); `count` counts prompts either way.
    """
    check_counts(count=count, batch_size=batch_size, shard_size=shard_size, max_prompt_tokens=max_prompt_tokens,
                 max_new_tokens=max_new_tokens)
    sets = list(sets)
    file_sets = [name for name in sets if name != MAGPIE]
    if MAGPIE in sets and file_sets and not 0 < magpie_fraction < 1:
        raise InputError(f"`magpie_fraction` must lie strictly between 0 and 1, got {magpie_fraction!r}; pass "
                         "--magpie-fraction 0.25, or leave magpie out of --sets")
    magpie = None if MAGPIE not in sets else {"fraction": magpie_fraction if file_sets else 1.0,
                                              **asdict(MagpieSettings())}
    out = Path(out)
    if any(Path(folder).resolve() == out.resolve() for folder in skip_held):
        raise InputError(f"--skip-held names the --out folder {out}: every prompt it holds would be passed over; "
                         "name other folders")
    out.mkdir(parents=True, exist_ok=True)
    if not isinstance(answers, Answers):
        raise InputError(f"`answers` must be an Answers(count, temperature, top_p), got {type(answers).__name__}")
    settings = {"target": target.name, "sets": sets, "max_prompt_tokens": max_prompt_tokens,
                "max_new_tokens": max_new_tokens, "seed": seed, "magpie": magpie, "sampling": answers.record()}
    fingerprint = tokenizer_fingerprint(target.tokenizer)
    done, shard, tokens, empty_ids = resume_point(out, settings, target.tokenizer, fingerprint)
    meta = {**settings, "prompts_requested": count, "format": "data-NNNNN.safetensors",
            "tokenizer_sha256": fingerprint, "decoding": answers.describe(),
            "chat_template": "target tokenizer's, add_generation_prompt=True"}
    # Written first, so that a run stopped right after its first shard still leaves the settings to resume with.
    write_meta(out, meta, len(done), tokens, {}, empty_ids, complete=False)
    writer = ShardWriter(out, shard, len(done), ShardSizer(shard_size, max_shard_bytes, fingerprint,
                                                            int(target.lm_head.weight.shape[0])))
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[note]}"), TimeRemainingColumn()) as progress:
        held = held_prompts(skip_held) if skip_held else frozenset()
        chosen, skipped, meta["magpie_prompts"] = _choose_prompts(target, out, file_sets, magpie, count, progress,
                                                                  max_prompt_tokens=max_prompt_tokens, seed=seed,
                                                                  batch_size=batch_size, held=held)
        skipped.update(empty_response=len(empty_ids))
        chosen = [item for item in answers.expand(chosen) if item[0] not in done and item[0] not in empty_ids]
        chosen.sort(key=lambda item: len(item[1]))  # similar lengths share a batch: less padding
        task = progress.add_task("regenerating", total=len(chosen), note=f"{tokens} tok")
        for start in range(0, len(chosen), batch_size):
            batch = chosen[start: start + batch_size]
            results = _answer(target, batch, answers, seed, max_new_tokens)
            examples = []
            for (example_id, ids), result in zip(batch, results):
                if not result.tokens or (result.finish_reason == "stop" and len(result.tokens) == 1):
                    empty_ids.add(example_id)  # nothing but the stop token: no block to learn from
                    skipped["empty_response"] = len(empty_ids)
                    continue
                examples.append(make_example(example_id, ids, result.tokens))
                tokens += len(result.tokens)
            if writer.add(examples):
                # Keep meta.json current: a run stopped early still leaves a described, usable folder.
                write_meta(out, meta, writer.written, tokens, skipped, empty_ids, complete=False)
            progress.update(task, advance=len(batch), note=f"{tokens} tok")
    writer.close()
    return write_meta(out, meta, writer.written, tokens, skipped, empty_ids, complete=True)


def check_counts(**values) -> None:
    """Refuse any of `values` (named as the `blockdraft data` flags) that is not a whole number >= 1."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"`{name}` must be a whole number >= 1, got {value!r}; "
                             f"pass --{name.replace('_', '-')} 1 or more")


def _answer(target, batch: list[tuple[str, list[int]]], answers: Answers, seed: int, max_new_tokens: int) -> list:
    """The target's answers to a batch of [(example id, prompt ids)]: greedy, or each sampled with its own seed."""
    prompts = [ids for _, ids in batch]
    if not answers.sampled:
        return Decoder(target, None).generate(prompts, max_new_tokens=max_new_tokens)
    from ..decode.options import DecodeOptions
    from ..sampling import SamplingParams

    options = DecodeOptions(sampling=SamplingParams(answers.temperature, top_p=answers.top_p), sampler="coupled")
    return Decoder(target, None).generate(prompts, max_new_tokens=max_new_tokens, options=options,
                                          seeds=[answer_seed(seed, example_id) for example_id, _ in batch])


class ShardWriter:
    """Cuts the examples handed to it into binary shards `out/data-NNNNN.safetensors`, numbered on from
    `number`, where `sizer` says (ShardSizer); `written` counts the examples in the folder's shards.
    `on_write(path, examples)`, when given, is called after each shard is written."""

    def __init__(self, out: Path, number: int, written: int, sizer: ShardSizer, on_write=None) -> None:
        self.out, self.number, self.written, self.sizer, self.on_write = out, number, written, sizer, on_write
        self.pending: list = []

    def add(self, examples: list) -> bool:
        """Queue `examples` and write every shard that is full; whether any was written."""
        self.pending += examples
        before = self.number
        while take := self.sizer.full(self.pending):
            self._write(take)
        return self.number > before

    def close(self) -> None:
        while take := self.sizer.take(self.pending):
            self._write(take)

    def _write(self, take: int) -> None:
        path = self.out / f"data-{self.number:05d}.safetensors"
        write_shard(path, self.pending[:take], tokenizer_sha256=self.sizer.tokenizer_sha256,
                    vocab_size=self.sizer.vocab_size)
        if self.on_write is not None:
            self.on_write(path, self.pending[:take])
        self.pending, self.number, self.written = self.pending[take:], self.number + 1, self.written + take


def _choose_prompts(target, out: Path, file_sets: list[str], magpie: dict | None, count: int, progress, *,
                    max_prompt_tokens: int, seed: int, batch_size: int,
                    held: set[bytes] = frozenset()) -> tuple[list, dict, dict | None]:
    """(the prompts to regenerate [(id, ids)], skipped counts, the magpie record or None).

    The file sets give count minus the magpie share; magpie prompts that repeat one of theirs are dropped.
    """
    magpie_count = 0 if magpie is None else round(count * magpie["fraction"])
    seen: set[str] = set()
    chosen, skipped = select_prompts(training_prompts(tuple(file_sets)) if file_sets else [], target.tokenizer,
                                     count=count - magpie_count, max_prompt_tokens=max_prompt_tokens,
                                     seed=seed, seen=seen, held=held)
    if not magpie_count:
        return chosen, skipped, None
    settings = MagpieSettings(**{key: value for key, value in magpie.items() if key != "fraction"})
    task = progress.add_task("writing magpie prompts", total=magpie_count, note="")
    prompts, record = magpie_prompts(
        target, out, magpie_count, seed=seed, batch_size=batch_size, settings=settings,
        on_batch=lambda tried, kept: progress.update(task, completed=min(kept, magpie_count), note=f"{tried} tried"))
    extra, more = select_prompts(prompts, target.tokenizer, count=magpie_count, max_prompt_tokens=max_prompt_tokens,
                                 seed=seed, seen=seen, held=held)
    return chosen + extra, {key: skipped[key] + more[key] for key in skipped}, record


def resume_point(out: Path, settings: dict, tokenizer, fingerprint: str) -> tuple[set[str], int, int, set[str]]:
    """(ids already written, the next shard's number, their response tokens, ids whose response was empty) of
    `out`.

    Shards written with other settings or another tokenizer are refused: mixing them would make one data set of
    two recipes. Prompts whose response came back empty are not regenerated (greedy decoding, or a seeded sampled
    answer, would give the same empty answer).
    """
    shards = shard_files(out)
    if not shards:
        return set(), 0, 0, set()
    meta_file = out / "meta.json"
    try:
        meta = json.loads(meta_file.read_text()) if meta_file.exists() else {}
    except json.JSONDecodeError as error:
        raise InputError(f"{meta_file} is not valid JSON ({error.msg}); it records the folder's settings: "
                         "restore it, or write to a new --out folder") from error
    # Folders written before tokenizer fingerprints existed record none (nor do their JSON Lines shards).
    now = {**settings, "tokenizer_sha256": meta.get("tokenizer_sha256") and fingerprint}
    changed = sorted(key for key, value in now.items() if meta.get(key) != value)
    if changed:
        raise InputError(f"{out} already holds shards built with other settings "
                         f"({ {key: meta.get(key) for key in changed} }, now { {k: now[k] for k in changed} }); "
                         "resume with the same settings, or write to a new --out folder")
    examples = read_examples(out, tokenizer)
    tokens = sum(sum(example.loss_mask) for example in examples)
    numbers = [int(match[1]) for f in shards if (match := re.fullmatch(r"data-(\d+)", f.stem))]
    return ({example.id for example in examples}, max(numbers, default=-1) + 1, tokens,
            set(meta.get("empty_response_ids", [])))


def write_meta(out: Path, meta: dict, examples: int, tokens: int, skipped: dict, empty_ids: set[str],
                complete: bool) -> dict:
    meta = {**meta, "examples": examples, "response_tokens": tokens, "skipped": skipped, "complete": complete,
            "empty_response_ids": sorted(empty_ids)}
    write_atomically(out / "meta.json", json.dumps(meta, indent=2))
    return meta
