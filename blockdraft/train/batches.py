"""From examples to the tensors of one training micro-batch (docs/training.md §2, §7).

Every random choice is a pure function of (seed, epoch) or (seed, step, dataset index), never of the batch
layout, the micro-batch size or the number of ranks:
- the held-out split and each epoch's order come from `seeded_generator(seed, ...)`;
- a step's global batch is a slice of that order; rank r takes every world-th sequence of it;
- each sequence's anchors come from its own generator seeded by (seed, step, dataset index).
So one optimizer step sees the same sequences with the same anchors whether it runs as one batch, as
micro-batches, or on several ranks; only floating-point summation order differs.

Shapes: B sequences, S padded length, A anchors, K block size, L*D tapped features.
"""

from __future__ import annotations

import hashlib
from array import array
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import InputError
from .answers import example_key
from .data import Example, example_prompt_key, read_examples, shard_files
from .objective import Blocks, batch_vocab, block_targets, sample_anchors, scored_blocks


def seeded_generator(*parts: int) -> torch.Generator:
    """A CPU generator seeded by a hash of integers (Python's `hash` is salted per process, so not that)."""
    digest = hashlib.sha256(":".join(str(int(p)) for p in parts).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


def split_heldout(count: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train indices, held-out indices), both sorted: a seeded random `fraction` of `count` examples.

    Random rather than "the last 2 %": data shards are often sorted (by prompt length, by source set).
    At least one example is held out when fraction > 0 and there are two or more.
    """
    if fraction <= 0 or count < 2:
        return list(range(count)), []
    held = min(count - 1, max(1, round(fraction * count)))
    order = torch.randperm(count, generator=seeded_generator(seed, -1)).tolist()
    return sorted(order[held:]), sorted(order[:held])


def split_by_prompt(examples: list[Example], fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """`split_heldout` over the examples' prompts: a prompt's answers (several sampled ones, answers.py) fall on
    one side together, so none is held out while another answer to its prompt is trained on. With one example a
    prompt it is `split_heldout` over the examples."""
    keys = [example_prompt_key(example) for example in examples]
    prompts = list(dict.fromkeys(keys))
    if len(prompts) == len(keys):
        return split_heldout(len(examples), fraction, seed)
    _, held = split_heldout(len(prompts), fraction, seed)
    held_prompts = {prompts[i] for i in held}
    return ([i for i, key in enumerate(keys) if key not in held_prompts],
            [i for i, key in enumerate(keys) if key in held_prompts])


def load_split(data_dirs: str | Path | Sequence[str | Path], val_fraction: float,
               seed: int, tokenizer=None, notes: list[str] | None = None) -> tuple[list[Example], list[int], list[int]]:
    """All examples of one or more data folders (in the order given), with the train and held-out index lists.

    An example whose prompt an earlier one has (the same prompt regenerated into two folders) is dropped, so it
    is neither trained twice an epoch nor held out while trained on; `notes` gets a line saying how many. Sampled
    answers (answers.py) are dropped only when the same answer came earlier. The held-out set is the `val/`
    shards of the folders that have them (less the prompts trained on); when none has, a seeded random
    `val_fraction` of the prompts with all their examples (`split_by_prompt`). With the target's `tokenizer`,
    shards built with another tokenizer are refused (`read_examples`).
    """
    folders = [Path(data_dirs)] if isinstance(data_dirs, (str, Path)) else [Path(f) for f in data_dirs]
    seen, repeats = set(), []
    examples = first_of_each_prompt([e for folder in folders for e in read_examples(folder, tokenizer)], seen, repeats)
    val_folders = [f / "val" for f in folders if f.is_dir() and (f / "val").is_dir() and shard_files(f / "val")]
    if val_folders:
        trained = {example_prompt_key(example) for example in examples}
        held, candidates = [], [e for folder in val_folders for e in read_examples(folder, tokenizer)]
        for example in first_of_each_prompt(candidates, seen, repeats):
            if example_prompt_key(example) in trained:
                repeats.append(example.id)  # another answer to a prompt trained on
            else:
                held.append(example)
        train_indices, val_indices = list(range(len(examples))), list(range(len(examples), len(examples) + len(held)))
        examples = examples + held
    else:
        train_indices, val_indices = split_by_prompt(examples, val_fraction, seed)
    if not train_indices:
        where = ", ".join(str(f) for f in folders)
        raise InputError(f"{where} holds no training examples; build data with `blockdraft data`")
    if repeats and notes is not None:
        notes.append(f"{len(repeats)} examples repeat the prompt of an earlier one (the same prompt in two data "
                     "folders, or twice in one) and were left out; each prompt is trained on once "
                     "(a sampled answer: each distinct one)")
    return examples, train_indices, val_indices


def first_of_each_prompt(examples: list[Example], seen: set[bytes], repeats: list[str]) -> list[Example]:
    """The examples whose key (`answers.example_key`: the token ids before the first supervised one, and for a
    sampled answer the answer too) neither `seen` nor an earlier example holds, in order; `seen` gets their keys
    and `repeats` the ids of those left out. Prompts, not ids: ids such as `magpie:17` count within their own
    folder only."""
    kept = []
    for example in examples:
        prompt = example_key(example)
        if prompt in seen:
            repeats.append(example.id)
        else:
            seen.add(prompt)
            kept.append(example)
    return kept


def data_fingerprint(examples: list[Example]) -> str:
    """sha256 of every example's id, tokens and loss mask, in order: what a resumed run must find again."""
    digest = hashlib.sha256()
    for example in examples:
        digest.update(example.id.encode() + b"\0")
        digest.update(array("q", example.input_ids).tobytes())
        digest.update(bytes(example.loss_mask))
        if (greedy := getattr(example, "greedy", None)) is not None:
            digest.update(b"greedy" + array("q", greedy).tobytes())
    return digest.hexdigest()


def epoch_batches(train_indices: list[int], epoch: int, batch_size: int, seed: int) -> list[list[int]]:
    """The global batches (dataset indices) of one epoch: a seeded permutation cut into batch_size slices."""
    order = torch.randperm(len(train_indices), generator=seeded_generator(seed, epoch)).tolist()
    shuffled = [train_indices[i] for i in order]
    return [shuffled[i : i + batch_size] for i in range(0, len(shuffled), batch_size)]


def rank_micro_batches(batch: list[int], rank: int, world: int, micro_batch_size: int) -> list[list[int] | None]:
    """This rank's share of a global batch, cut into micro-batches; None marks a dummy micro-batch.

    Every rank runs the same number of micro-batches (DDP needs one backward per rank per micro-batch, or
    it hangs); a rank whose share is shorter runs dummies with zero weight (docs/training.md §5.13).
    """
    share = batch[rank::world]
    count = math.ceil(math.ceil(len(batch) / world) / micro_batch_size)
    chunks = [share[i * micro_batch_size : (i + 1) * micro_batch_size] for i in range(count)]
    return [chunk or None for chunk in chunks]


@dataclass
class MicroBatch:
    tokens: torch.Tensor  # [B, S] right-padded with 0
    loss_mask: torch.Tensor  # [B, S] 1 on supervised tokens, 0 on prompt and padding
    anchors: torch.Tensor  # [B, A]
    keep: torch.Tensor  # [B, A] bool
    blocks: Blocks  # labels and weights [B, A, K]; weight 0 where the label is outside `vocab`
    supervised: torch.Tensor  # [B, A, K] bool: the slots the data supervises, scored or not (accuracy counts these)
    vocab: torch.Tensor | None  # [N'] the ids the head scores (the proposal vocabulary and the prompts'), or None
    indices: list[int]  # the dataset index of each row (a dummy's row is its stand-in example)
    lengths: list[int]  # real tokens per row, after truncation to max_seq_len

    @property
    def weight(self) -> float:
        """Sum of the loss weights: this micro-batch's share of the step's normaliser W (float64)."""
        return float(self.blocks.weights.double().sum())


def make_micro_batch(examples: list[Example], indices: list[int] | None, *, step: int, seed: int,
                     num_anchors: int, block_size: int, gamma: float, max_seq_len: int,
                     device: torch.device, dummy_index: int, vocab: torch.Tensor | None = None) -> MicroBatch:
    """Pad the sequences `indices` (truncated to max_seq_len) and draw their anchors for `step`.

    `vocab` [N] (a proposal vocabulary): the head scores those ids and the rows' prompt ids only, and a slot whose
    label is outside them gets weight 0 (it still counts as a miss in the accuracy).

    `indices=None` builds a dummy: example `dummy_index` with its loss mask zeroed, so it has no anchors and
    every weight is 0, yet the forward and backward run exactly as for real data.
    """
    dummy = indices is None
    rows = [dummy_index] if dummy else indices
    seqs = [examples[i].input_ids[:max_seq_len] for i in rows]
    masks = [[0] * len(s) if dummy else examples[i].loss_mask[:max_seq_len] for i, s in zip(rows, seqs)]
    S = max(len(s) for s in seqs)
    tokens = torch.zeros(len(rows), S, dtype=torch.long)
    loss_mask = torch.zeros(len(rows), S, dtype=torch.long)
    anchors, keep = [], []
    for b, (index, seq, mask) in enumerate(zip(rows, seqs, masks)):
        tokens[b, : len(seq)] = torch.tensor(seq)
        loss_mask[b, : len(seq)] = torch.tensor(mask)
        # Drawn on the unpadded sequence with its own generator: padding and batch-mates never change them.
        a, k = sample_anchors(loss_mask[b : b + 1, : len(seq)], num_anchors, seeded_generator(seed, step, index))
        anchors.append(a)
        keep.append(k)
    tokens, loss_mask = tokens.to(device), loss_mask.to(device)
    anchors, keep = torch.cat(anchors).to(device), torch.cat(keep).to(device)  # [B, A]
    greedy = _greedy_labels([examples[i] for i in rows], tokens, max_seq_len)
    blocks = block_targets(tokens, loss_mask, anchors, keep, block_size, gamma, greedy)
    scored = batch_vocab(vocab, tokens, loss_mask)
    return MicroBatch(tokens, loss_mask, anchors, keep, scored_blocks(blocks, scored), blocks.weights > 0, scored,
                      list(rows), [len(s) for s in seqs])


def _greedy_labels(rows: list[Example], tokens: torch.Tensor, max_seq_len: int) -> torch.Tensor | None:
    """[B, S] the target's argmax after each position where any row is a prefill-labelled human answer, else
    None; a row of the target's own text takes its next token (g[t] = x[t + 1], the same labels)."""
    if all(getattr(example, "greedy", None) is None for example in rows):
        return None
    greedy = torch.zeros_like(tokens)
    greedy[:, :-1] = tokens[:, 1:]
    for b, example in enumerate(rows):
        if example.greedy is not None:
            labels = example.greedy[:max_seq_len]
            greedy[b, : len(labels)] = torch.tensor(labels, device=tokens.device)
    return greedy
