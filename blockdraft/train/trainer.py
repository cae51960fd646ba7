"""`train(target, cfg)`: the DFlash draft training loop (docs/training.md §2, §7), single process or torchrun.

Per optimizer step:
1. Batch: the step's global batch (a slice of the epoch's seeded order); this rank takes every world-th
   sequence, cut into micro-batches; anchors are drawn per sequence from (seed, step, dataset index).
2. Normaliser: W = Σ w over the whole step, all-reduced over ranks before any forward. W = 0: every rank
   skips the step (they all see the same W, so no collective is left waiting).
3. Micro-batches: a no-grad target forward (or the feature cache) gives the features (and, for KD, the
   teacher's final-normed states), standardized when the run asks for it; the draft runs over every block;
   each micro-batch backpropagates world_size · Σ w·loss / W, the loss being CE, or mixed with KD, over the
   full or the proposal vocabulary, with D-PACE factors on w when asked (DDP averages gradients; it syncs on
   the last one).
4. Update: clip, AdamW at the warmup-cosine learning rate of this step.
Then log, evaluate on held-out data, checkpoint (rank 0 writes).

A run ends after its last step, or with `time_budget` after the first step that ends past the budget; it then
logs, evaluates and checkpoints as at its last step, and writes the draft. `save_draft_every_seconds` also
writes the draft folder while the run goes on (atomically), so a run killed mid-way leaves a loadable draft.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from contextlib import nullcontext
from pathlib import Path
from time import monotonic
from typing import Callable

import torch

from .. import heap
from ..config import DraftConfig, check_against_target, choose_mask_token_id, provenance_for
from ..io.checkpoint import read_checkpoint
from ..io.vocab import read_vocab
from ..io.targets import parse_dtype
from ..model.draft import DFlashDraftModel
from ..model.target import Target
from .batches import data_fingerprint, load_split, make_micro_batch, rank_micro_batches, seeded_generator
from .checkpointing import dtype_name, restore, save_draft, save_training_state
from .compiled import compiled_model
from .data import Example, emitted_tokens, frequent_tokens
from .evaluate import BlockMetrics, evaluate_teacher_forced
from .feature_store import FeatureStore, store_dir, token_digest
from .features import FeatureCache
from .grow import grown_config, load_grown
from .target_init import copy_target_layers
from .forward import (BlockForward, autocast, feature_scale, freeze_target, head_weight, split_teacher,
                      target_features)
from .objective import weighted_loss
from .preflight import check_data, check_init, data_notes
from .ranks import Ranks
from .report import MetricsLog, plot_curves, progress_bar, progress_info
from .run import Run
from .settings import TrainConfig

__all__ = ["TrainConfig", "train"]

# Optimizer steps between handing the heap's free pages back (heap.py): trimmed after every 8th step, a run over the
# feature stores held 2.7 GB at the steps a minute of an untrimmed one (5.6 GB and rising); after every step, 0.9x.
TRIM_EVERY = 8


def train(target: Target, cfg: TrainConfig, *, on_step: Callable[[int], None] | None = None) -> Path:
    """Train a draft for `target` on `cfg.data_dirs`; returns the final draft folder `cfg.out_dir/draft`.

    `on_step(step)` is called on every rank after each optimizer step (and its logging and checkpoint).
    """
    ranks = Ranks.start(target.device)
    finished = False
    try:
        run, log = _prepare(target, cfg, ranks)
        with progress_bar(ranks.rank == 0) as progress:
            task = progress.add_task("train", total=run.total_steps, completed=run.step, info="")
            run.started = monotonic() - run.elapsed  # a resumed run continues its checkpoint's clock
            while not run.finished:
                _step(run)
                run.elapsed = _elapsed(run)
                _after_step(run, log)
                info = progress_info(run.last_train, run.last_val, run.lr)
                progress.update(task, completed=run.step, info=info)
                if on_step is not None:
                    on_step(run.step)
        folder = _finish(run, log)
        finished = True
        return folder
    finally:
        ranks.stop(finished)


def _prepare(target: Target, cfg: TrainConfig, ranks: Ranks) -> tuple[Run, MetricsLog | None]:
    """Refuse bad inputs, build the draft and optimizer, and restore a checkpoint: all before any step."""
    freeze_target(target)
    repeats: list[str] = []
    examples, train_indices, val_indices = load_split(cfg.data_dirs, cfg.val_fraction, cfg.seed,
                                                      tokenizer=target.tokenizer, notes=repeats)
    draft_cfg, draft = _build_draft(target, cfg)
    notes = [check_data(examples, draft_cfg, cfg.data_names, cfg.max_seq_len), *data_notes(cfg.data_dirs, target.name),
             *repeats]
    for note in notes if ranks.rank == 0 else []:
        if note:
            print(f"note: {note}")
    forward = BlockForward(draft, target)
    if cfg.standardize_features:
        scale = _measure_scale(target, examples, train_indices, draft_cfg, cfg)
        # Weights that read raw features already (a loaded draft, the target's layers) keep their function.
        forward.standardize(scale, convert_weights=cfg.init_from is not None or cfg.init_target_layers is not None)
    named = [(n, p) for n, p in draft.named_parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW([p for _, p in named], lr=cfg.lr, weight_decay=cfg.weight_decay)
    names = [n for n, _ in named]
    per_epoch = math.ceil(len(train_indices) / cfg.batch_size)
    total = per_epoch * cfg.epochs if cfg.max_steps is None else min(per_epoch * cfg.epochs, cfg.max_steps)
    use_autocast = cfg.dtype != "float32" and (target.device.type != "cpu" or cfg.cpu_autocast)
    autocast_dtype = parse_dtype(cfg.dtype) if use_autocast else None
    run = Run(cfg, target, ranks, examples, train_indices, val_indices, draft_cfg, forward, forward, optimizer,
              names, head_weight(target, autocast_dtype or torch.float32), autocast_dtype, total,
              data_sha256=data_fingerprint(examples))
    resume_step = restore(run)
    if ranks.world > 1:
        device_ids = [target.device.index] if target.device.type == "cuda" else None
        run.model = torch.nn.parallel.DistributedDataParallel(forward, device_ids=device_ids)
    run.model = compiled_model(run.model, cfg.compile, cfg.time_budget, total, target.device,
                               say=print if ranks.rank == 0 else lambda _: None)
    run.metrics = BlockMetrics.zeros(draft_cfg.block_size, target.device)
    if cfg.cache_features or cfg.feature_store:
        run.cache = _feature_cache(run, ranks.rank == 0)
    run.vocab_ids, run.vocab_source = _proposal_ids(cfg, examples, target.lm_head.weight.shape[0])
    if cfg.proposal_vocab or cfg.head_ids is not None or cfg.head_ids_from is not None:
        run.vocab = torch.tensor(run.vocab_ids, dtype=torch.long, device=target.device)
    log = None
    if ranks.rank == 0:
        cfg.out_dir.mkdir(parents=True, exist_ok=True)
        log = MetricsLog(cfg.out_dir / "metrics.jsonl", resume_step)
    return run, log


def _build_draft(target: Target, cfg: TrainConfig) -> tuple[DraftConfig, DFlashDraftModel]:
    """A fresh draft shaped like the target, or `init_from`'s (grown by `grow_layers`, grow.py); checked against the
    target before any step."""
    provenance = provenance_for(target.config, target.tokenizer, target=target.name or None)
    if cfg.init_from is not None:
        draft_cfg, tensors = read_checkpoint(cfg.init_from, dtype=torch.float32)
        check_init(cfg, draft_cfg)
        # Before its provenance is replaced by this target's: a draft of another tokenizer or architecture would
        # continue on ids that mean other tokens. Checkpoints without fingerprints (published ones) pass.
        check_against_target(draft_cfg, target.config, target.tokenizer, strict=True)
        draft_cfg = dataclasses.replace(grown_config(draft_cfg, cfg.grow_layers), block_size=cfg.block_size)
    else:
        mask = choose_mask_token_id(target.tokenizer, target.config, cfg.mask_token_id)
        draft_cfg = DraftConfig.for_target(target.config, cfg.num_draft_layers, cfg.block_size,
                                           mask_token_id=mask, target_layer_ids=cfg.target_layer_ids)
    draft_cfg = dataclasses.replace(draft_cfg, provenance=provenance)
    for message in check_against_target(draft_cfg, target.config, target.tokenizer):
        warnings.warn(message, stacklevel=3)
    draft = DFlashDraftModel(draft_cfg)
    if cfg.init_from is not None and cfg.grow_layers:
        load_grown(draft, tensors, seeded_generator(cfg.seed, -2))
    elif cfg.init_from is not None:
        draft.load_state_dict(tensors, strict=True)
    else:
        draft.init_weights(0.02, generator=seeded_generator(cfg.seed, -2))
        if cfg.init_target_layers is not None:
            copy_target_layers(draft, target, cfg.init_target_layers)
    return draft_cfg, draft.to(device=target.device, dtype=torch.float32).train()


def _proposal_ids(cfg: TrainConfig, examples: list[Example], vocab_size: int) -> tuple[list[int], str]:
    """The draft's proposal vocabulary and where it came from: the ids the target emitted in the training
    responses, joined with the vocabulary of the draft this run continues (`init_from`'s sidecar), so that a
    draft continued on new data still proposes what it learnt from the old. With `head_ids` = N: the N most
    frequent emitted ids alone (the head scores no others); with `head_ids_from`, that draft folder's ids alone."""
    if cfg.head_ids_from is not None:
        ids = read_vocab(cfg.head_ids_from, vocab_size)  # settings checked that it has one
        return ids.tolist(), f"the {ids.numel()} ids of {cfg.head_ids_from}'s proposal vocabulary"
    source = f"response tokens of {len(examples)} training examples in {cfg.data_names}"
    if cfg.head_ids is not None:
        ids = frequent_tokens(examples, cfg.head_ids)
        return ids, f"the {len(ids)} most frequent {source}"
    ids = set(emitted_tokens(examples))
    inherited = read_vocab(cfg.init_from, vocab_size) if cfg.init_from is not None else None
    if inherited is not None:
        ids.update(inherited.tolist())
        source += f", joined with the {inherited.numel()} ids of {cfg.init_from}'s proposal vocabulary"
    return sorted(ids), source


def _measure_scale(target: Target, examples: list[Example], train_indices: list[int], draft_cfg: DraftConfig,
                   cfg: TrainConfig) -> torch.Tensor:
    """Per-dimension feature RMS over the first `scale_sequences` training sequences (same on every rank)."""
    max_len = min(cfg.max_seq_len, target.max_positions)
    features = []
    for i in train_indices[: cfg.scale_sequences]:
        tokens = torch.tensor([examples[i].input_ids[:max_len]], device=target.device)
        features.append(target_features(target, tokens, draft_cfg.target_layer_ids)[0])
    return feature_scale(features)


def _feature_cache(run: Run, speak: bool) -> FeatureCache:
    """The run's feature cache, over the data folders' feature stores when the run reads them."""
    if not run.cfg.feature_store:
        return FeatureCache(run.target, _tap_ids(run))
    folders = [store_dir(d, run.target, _tap_ids(run)) for d in run.cfg.data_dirs]
    disk = FeatureStore(folders)
    digests = [token_digest(e.input_ids) for e in run.examples]
    stored = sum(d in disk for d in digests)
    if speak:
        build = " ".join(f"--data {d}" for d in run.cfg.data_dirs)
        print(f"note: the feature store holds {stored:,} of {len(digests):,} sequences; the target runs for the rest"
              + ("" if stored == len(digests) else f" (build it with `blockdraft features {build}`, same taps "
                 f"{','.join(map(str, _tap_ids(run)))} and target dtype)"))
    return FeatureCache(run.target, _tap_ids(run), disk, digests)


def _elapsed(run: Run) -> float:
    """Seconds since the first step, averaged over ranks: every rank then takes the same learning rate and stops
    after the same step (a rank stopping alone would leave the others waiting in a collective)."""
    seconds = monotonic() - run.started
    if run.ranks.world == 1:
        return seconds
    return float(run.ranks.sum(torch.tensor(seconds, dtype=torch.float64, device=run.device))) / run.ranks.world


def _lr(run: Run, step: float) -> float:
    """Linear warmup over the first warmup_fraction of steps, then cosine down to min_lr.

    With a time budget the schedule runs by whichever is further along, the steps or the clock: step s after t of
    T seconds counts as max(s, total · t/T), so warmup and decay end with the budget even when the steps would
    not (t < T at every step the loop takes, so the position stays below total)."""
    cfg, total = run.cfg, run.total_steps
    if cfg.time_budget is not None:
        step = max(step, total * run.elapsed / cfg.time_budget)
    warmup = math.ceil(cfg.warmup_fraction * total)
    if step < warmup:
        return cfg.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return cfg.min_lr + (cfg.lr - cfg.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _step(run: Run) -> None:
    """One optimizer step (numbered as in the module docstring); advances step, epoch and position."""
    cfg, ranks, K = run.cfg, run.ranks, run.draft_cfg.block_size
    # 1. Batch.
    batch = run.batches_of(run.epoch)[run.position]
    micro_size = cfg.micro_batch_size or math.ceil(cfg.batch_size / ranks.world)
    micro = [make_micro_batch(run.examples, part, step=run.step, seed=cfg.seed, num_anchors=cfg.anchors,
                              block_size=K, gamma=cfg.loss_gamma, max_seq_len=run.max_len, device=run.device,
                              dummy_index=batch[0], vocab=run.vocab)
             for part in rank_micro_batches(batch, ranks.rank, ranks.world, micro_size)]
    # 2. Normaliser, before any forward: the weights do not depend on the model.
    W = float(ranks.sum(torch.tensor(sum(m.weight for m in micro), dtype=torch.float64, device=run.device)))
    run.lr = _lr(run, run.step)
    if W > 0:
        # 3. Micro-batches.
        for i, mb in enumerate(micro):
            sync = i == len(micro) - 1 or ranks.world == 1
            with nullcontext() if sync else run.model.no_sync():
                features, teacher = _features(run, mb)
                with autocast(run.device, run.autocast_dtype):
                    hidden = run.model(mb.tokens, mb.anchors, mb.keep, features)
                    total, hits = weighted_loss(hidden, run.head, mb.blocks, teacher=teacher,
                                                kd_weight=cfg.kd_weight, dpace_alpha=cfg.loss_dpace_alpha,
                                                vocab=mb.vocab)
                (total * (ranks.world / W)).backward()
            run.metrics.add(total, hits, mb.blocks.weights, mb.supervised)
        # 4. Update.
        for group in run.optimizer.param_groups:
            group["lr"] = run.lr
        run.grad_norm = float(torch.nn.utils.clip_grad_norm_(run.forward.parameters(), cfg.clip))
        run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
    else:
        run.skipped += 1
    run.step += 1
    run.position += 1
    if run.position == len(run.batches_of(run.epoch)):
        run.epoch, run.position = run.epoch + 1, 0


def _tap_ids(run: Run) -> tuple[int, ...]:
    """The target layers a training forward taps: the draft's, then (for KD) the last one, which the target
    returns final-normed, so that the frozen head turns it into the teacher's logits."""
    kd = (run.target.num_layers - 1,) if run.cfg.kd_weight > 0 else ()
    return tuple(run.draft_cfg.target_layer_ids) + kd


def _features(run: Run, mb) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The micro-batch's tapped features [B, S, L*D] and, for KD, the teacher states [B, S, D] (else None):
    from the cache when it is on."""
    if run.cache is not None:
        tapped = run.cache.features(mb.tokens, mb.indices, mb.lengths)
    else:
        tapped = target_features(run.target, mb.tokens, _tap_ids(run))
    return split_teacher(tapped, run.forward.draft.fc.in_features)


def _after_step(run: Run, log: MetricsLog | None) -> None:
    """Log every log_every steps, evaluate every eval_every, checkpoint every save_every (and at the end); write
    the draft every save_draft_every_seconds."""
    cfg, step, last = run.cfg, run.step, run.finished
    if step % cfg.log_every == 0 or last:
        # Every rank reaches this at the same step: the one all-reduce of the interval's sums.
        summary = BlockMetrics(run.metrics.block_size, run.ranks.sum(run.metrics.sums)).summary()
        run.metrics = BlockMetrics.zeros(run.draft_cfg.block_size, run.device)
        run.last_train = {"split": "train", "step": step, "epoch": run.epoch, "lr": run.lr,
                          "loss": summary["loss"], "acc": summary["acc"], "grad_norm": round(run.grad_norm, 5),
                          "skipped": run.skipped}
        if log is not None:
            log.write(run.last_train)
    if run.val_indices and (step % cfg.eval_every == 0 or last):
        run.last_val = _evaluate(run)
        if log is not None:
            log.write({"split": "val", "step": step, **run.last_val})
            plot_curves(log.records, cfg.out_dir / "curves.png")
    if (step % cfg.save_every == 0 or last) and run.ranks.rank == 0:
        state = {"format": 1, "step": step, "epoch": run.epoch, "position": run.position, "elapsed": run.elapsed,
                 "skipped": run.skipped, "total_steps": run.total_steps, "world_size": run.ranks.world,
                 "scheduler": {"kind": "linear warmup, cosine", "lr": run.lr,
                               "warmup_steps": math.ceil(cfg.warmup_fraction * run.total_steps)},
                 "rng": {"seed": cfg.seed, "order": "sha256(seed, epoch)", "anchors": "sha256(seed, step, index)"},
                 "data": {"folders": cfg.data_names, "examples": len(run.examples), "sha256": run.data_sha256},
                 "config": cfg.run_fields(), "target_dtype": dtype_name(run.forward.target.dtype)}
        save_training_state(cfg.out_dir, run.draft_cfg, run.forward.export_state(), run.optimizer, run.names, state,
                            trained=run.forward.trained_state())
    every = cfg.save_draft_every_seconds
    if every is not None and not last and run.elapsed - run.draft_saved >= every and run.ranks.rank == 0:
        _write_draft(run)
        run.draft_saved = run.elapsed
    if step % TRIM_EVERY == 0:
        heap.trim()  # without it the heap keeps the pages of every batch's differently sized tensors (heap.py)


def _evaluate(run: Run) -> dict:
    """Teacher-forced held-out metrics; ranks split the held-out examples and pool the sums."""
    indices = run.val_indices[run.ranks.rank :: run.ranks.world]
    metrics = evaluate_teacher_forced(run.forward, run.head, [run.examples[i] for i in indices],
                                      gamma=run.cfg.loss_gamma, max_seq_len=run.max_len,
                                      anchors_per_pass=run.cfg.anchors, autocast_dtype=run.autocast_dtype,
                                      cache=run.cache, indices=indices, vocab=run.vocab)
    summary = BlockMetrics(metrics.block_size, run.ranks.sum(metrics.sums)).summary()
    return {k: summary[k] for k in ("loss", "acc", "tf_tau")}


def _finish(run: Run, log: MetricsLog | None) -> Path:
    """Write the final draft (bf16, with provenance) to the draft folder on rank 0."""
    if run.ranks.rank == 0:
        _write_draft(run)
        if log is not None and log.records:
            plot_curves(log.records, run.cfg.out_dir / "curves.png")
    return run.cfg.draft_folder


def _write_draft(run: Run) -> Path:
    return save_draft(run.cfg.draft_folder, run.draft_cfg, run.forward.export_state(), run.vocab_ids,
                      run.target.lm_head.weight.shape[0], run.vocab_source)
