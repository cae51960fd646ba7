"""The DFlash training objective (docs/training.md §2), as pure functions over tensors.

Per sequence: tokens x [S], loss mask m [S] (1 on response tokens), tapped target features F [S, L*D].
A anchors p_j are drawn from C = {p : m[p] = m[p+1] = 1}; block j is [x[p_j], MASK x (K-1)] at positions
p_j..p_j+K-1. Block rows see the context strictly before their anchor and their own block (both ways),
nothing else. Slot k (1..K-1) of block j is trained to predict x[p_j + k] with weight exp(-(k-1)/gamma)
over the contiguous supervised prefix of the block. Slot 0 never counts. Optionally (KD, docs/training.md §3) a
slot also learns the target's own distribution at p_j+k-1, which predicts its label; D-PACE (§3) replaces
the decay by weights from the draft's own current acceptance.

Shapes: B sequences, S tokens, A anchors, K block size, D hidden, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..decode.vocab import with_prompt_tokens
from ..model.layers import AnchoredBlocks
from .cross_entropy import cross_entropy_and_argmax


@dataclass
class Blocks:
    anchors: torch.Tensor  # [B, A] anchor positions p_j (0 where padded)
    keep: torch.Tensor  # [B, A] bool, False for padding blocks
    labels: torch.Tensor  # [B, A, K] y_{j,k} = x[p_j + k] (g[p_j + k - 1] for prefill labels; 0 past the end)
    weights: torch.Tensor  # [B, A, K] w_{j,k} float32


def anchor_candidates(loss_mask: torch.Tensor) -> torch.Tensor:
    """C as a bool [B, S]: positions p with m[p] = m[p+1] = 1 (never the last position)."""
    m = loss_mask.bool()
    out = torch.zeros_like(m)
    out[:, :-1] = m[:, :-1] & m[:, 1:]
    return out


def sample_anchors(loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator):
    """Draw min(A, |C|) distinct anchors per row uniformly from C, sorted; pad with keep = False.

    Returns anchors [B, A] long and keep [B, A] bool. Random keys per position, then the A smallest keys
    among the candidates: uniform without replacement, and independent of the other rows.
    """
    cand = anchor_candidates(loss_mask)  # [B, S]
    keys = torch.rand(cand.shape, generator=generator, device=cand.device)
    keys = keys.masked_fill(~cand, float("inf"))
    A = min(num_anchors, cand.shape[1])
    chosen_keys, chosen = keys.topk(A, dim=1, largest=False)  # [B, A]
    keep = torch.isfinite(chosen_keys)
    anchors = torch.where(keep, chosen, torch.zeros_like(chosen))
    # Sort kept anchors ascending, padding last.
    order = torch.where(keep, anchors, torch.full_like(anchors, cand.shape[1])).argsort(dim=1)
    anchors, keep = anchors.gather(1, order), keep.gather(1, order)
    if A < num_anchors:
        pad = num_anchors - A
        anchors = torch.cat([anchors, anchors.new_zeros(anchors.shape[0], pad)], 1)
        keep = torch.cat([keep, keep.new_zeros(keep.shape[0], pad)], 1)
    return anchors, keep


def decay_weights(block_size: int, gamma: float) -> torch.Tensor:
    """[K] weights: 0 for slot 0, exp(-(k-1)/gamma) for k >= 1."""
    k = torch.arange(block_size, dtype=torch.float32)
    return torch.where(k >= 1, torch.exp(-(k - 1) / gamma), torch.zeros(()))


def block_targets(tokens, loss_mask, anchors, keep, block_size: int, gamma: float, greedy=None) -> Blocks:
    """Labels and weights of every block (docs/training.md §2.6).

    `greedy` [B, S] (human-written text labelled by one target prefill, §1): g[t] is the target's argmax after
    x[..t]. Slot k is then labelled g[p_j + k - 1] and counts only while the text followed the target's greedy
    path before it, x[p_j + i] = g[p_j + i - 1] for i = 1..k-1, so every label is what the target would write.
    Where the text is the target's own greedy answer (g[t] = x[t + 1]) this is the plain rule.
    """
    B, S = tokens.shape
    idx = anchors[..., None] + torch.arange(block_size, device=tokens.device)  # [B, A, K] absolute positions
    inside = idx < S
    flat = idx.clamp(max=S - 1).view(B, -1)
    labels = tokens.gather(1, flat).view_as(idx) * inside  # x[p_j + k]
    supervised = loss_mask.gather(1, flat).view_as(idx).bool() & inside
    supervised[..., 0] = True  # slot 0 is excluded by the decay weight, not by the prefix product
    if greedy is not None:
        before = (idx - 1).clamp(min=0, max=S - 1).view(B, -1)
        guesses = greedy.gather(1, before).view_as(idx) * inside  # g[p_j + k - 1]
        on_path = labels == guesses  # [B, A, K] slot k's text token is the target's own
        supervised[..., 2:] &= on_path[..., 1:-1]  # slot k needs slots 1..k-1 on the path (with the cumprod)
        labels = torch.cat([labels[..., :1], guesses[..., 1:]], dim=-1)
    prefix = supervised.long().cumprod(dim=-1).bool()  # contiguous supervised prefix only
    valid = prefix & keep[..., None]
    weights = valid.float() * decay_weights(block_size, gamma).to(tokens.device)
    return Blocks(anchors, keep, labels, weights)


def block_inputs(tokens, anchors, keep, block_size: int, mask_token_id: int):
    """Block token ids [B, A*K] ([x[p_j], MASK...], MASK for padding blocks) and positions [B, A*K]."""
    B, A = anchors.shape
    ids = torch.full((B, A, block_size), mask_token_id, dtype=torch.long, device=tokens.device)
    ids[..., 0] = torch.where(keep, tokens.gather(1, anchors), torch.full_like(anchors, mask_token_id))
    positions = anchors[..., None] + torch.arange(block_size, device=tokens.device)  # [B, A, K]
    return ids.view(B, -1), positions.view(B, -1)


def block_attention_mask(anchors, keep, seq_len: int, block_size: int, leaky: bool = False) -> torch.Tensor:
    """allow(q, c) [B, A*K, S + A*K]: context strictly before the anchor, plus the query's own block.

    `leaky=True` builds the wrong `c <= p_j` variant; it exists only so a test can show it differs.
    """
    B, A = anchors.shape
    ctx = context_visibility(anchors, keep, seq_len, block_size, leaky)
    block_of_query = torch.arange(A * block_size, device=anchors.device) // block_size
    own = block_of_query[:, None] == block_of_query[None, :]  # [A*K, A*K]
    return torch.cat([ctx, own[None].expand(B, -1, -1)], dim=2)


def context_visibility(anchors, keep, seq_len: int, block_size: int, leaky: bool = False) -> torch.Tensor:
    """The context part of `block_attention_mask`: [B, A*K, S], c < p_j (or the wrong c <= p_j when leaky)."""
    B, A = anchors.shape
    c = torch.arange(seq_len, device=anchors.device)
    p = anchors[..., None]  # [B, A, 1]
    ctx = ((c <= p) if leaky else (c < p)) & keep[..., None]  # [B, A, S]
    return ctx[:, :, None, :].expand(B, A, block_size, seq_len).reshape(B, A * block_size, seq_len)


def draft_hidden(draft, embed, features, tokens, anchors, keep, block_size: int, leaky: bool = False,
                 dense: bool = False):
    """Training-path forward: final-normed draft states [B, A*K, D] for every block at once.

    The mask goes in factored form (AnchoredBlocks: context visibility plus own block), which costs
    O(A·K·(S+K)) attention; `dense=True` uses `block_attention_mask` as one [B, A*K, S+A*K] mask instead.
    """
    B, S = tokens.shape
    ids, positions = block_inputs(tokens, anchors, keep, block_size, draft.config.mask_token_id)
    ctx = draft.project_context(features)  # [B, S, D]
    ctx_positions = torch.arange(S, device=tokens.device).expand(B, S)
    ctx_kv = draft.context_kv(ctx, ctx_positions)
    if dense:
        mask = block_attention_mask(anchors, keep, S, block_size, leaky)
    else:
        mask = AnchoredBlocks(context_visibility(anchors, keep, S, block_size, leaky), block_size)
    return draft(embed(ids), positions, ctx_kv, mask)


def teacher_positions(blocks: Blocks) -> torch.Tensor:
    """[B, A, K] the position whose target distribution teaches slot k of block j: p_j + k - 1 (docs/training.md §3).

    That distribution predicts x[p_j + k], the slot's label. Slot 0 gets p_j - 1, clamped to 0; it never counts.
    """
    K = blocks.labels.shape[-1]
    return (blocks.anchors[..., None] + torch.arange(K, device=blocks.anchors.device) - 1).clamp(min=0)


def dpace_weights(ce: torch.Tensor, valid: torch.Tensor, alpha: float = 0.5) -> torch.Tensor:
    """D-PACE slot weights [..., K] (docs/training.md §3): w_k = v_k · Σ_{m=k}^{K-1} v_m Π_{i=1}^{m} q̃_i.

    q̃_i = (1-α)·exp(-CE_i) + α is a floored estimate of slot i's acceptance, so the sum is the expected
    number of accepted slots that need slot k: slots behind a likely miss weigh little. ce and valid [..., K]
    (v: 1 on the block's supervised prefix, slot 0 excluded); pass ce detached (the weights take no gradient).
    """
    q = (1 - alpha) * torch.exp(-ce.float()) + alpha
    q[..., 0] = 1.0  # the products start at slot 1
    term = valid * torch.cumprod(q, dim=-1)  # v_m Π_{i=1}^{m} q̃_i
    return valid * term.flip(-1).cumsum(-1).flip(-1)


# Beyond this many bytes of float32 head activations kept for the backward pass, each chunk's logits are recomputed
# in the backward pass instead of kept (`weighted_loss`): a 152k vocabulary over 30k supervised rows keeps 18 GB
# of logits (cross_entropy.py keeps nothing else; KD adds its log-softmax and the teacher's softmax); a chunk
# recomputed costs one more head product.
HEAD_MEMORY_BUDGET = 2**31
# A CPU chunk's logits stay under glibc's largest mmap threshold (32 MiB on 64-bit): larger blocks are mapped
# fresh on every allocation and page-faulted on first touch, which made the head's softmax passes 2.8x slower
# over a 23k-id vocabulary (1,152 rows at once against chunks of 256). GPUs take 2048 rows a chunk.
CPU_CHUNK_BYTES = 24 * 2**20


def head_chunk_rows(device: torch.device, columns: int) -> int:
    """Rows of head logits computed at once: 2048 on accelerators, on a CPU as many as fit CPU_CHUNK_BYTES."""
    return 2048 if device.type != "cpu" else max(16, CPU_CHUNK_BYTES // (4 * max(1, columns)))


def weighted_loss(hidden, head_weight, blocks: Blocks, chunk_rows: int | None = None, teacher=None,
                  kd_weight: float = 0.0, dpace_alpha: float | None = None, vocab: torch.Tensor | None = None,
                  recompute: bool | None = None):
    """Sum over supervised slots of w * loss, and which supervised slots the draft's argmax gets right.

    hidden [B, A*K, D], head_weight [V, D]. The per-slot loss is CE against the label, or with `teacher`
    (final-normed target states [B, S, D]) and kd_weight λ > 0, (1-λ)·CE + λ·KD with
    KD = -Σ_v softmax(teacher logits at p_j+k-1)_v · log softmax(Z_{j,k})_v (docs/training.md §3).
    With `dpace_alpha`, blocks.weights must be the plain validity v (gamma = inf) and every slot's weight
    becomes `dpace_weights` of the draft's own (detached) CE. With `vocab` (sorted distinct ids [N] that hold
    every supervised label) the head scores those ids only, as the decoder does with a proposal vocabulary:
    CE, KD (the teacher renormalised over them) and argmax are all over the N ids.
    Only rows with w > 0 reach the LM head (A*K*V logits per sequence would not fit otherwise), in chunks of
    `chunk_rows` (default `head_chunk_rows`).
    `recompute` (None: when the kept activations would pass HEAD_MEMORY_BUDGET) keeps only each chunk's input for
    the backward pass and recomputes its logits there: the same loss and gradients, in a chunk's memory.
    Returns (weighted loss sum: a differentiable scalar, hits [B, A, K] bool: argmax == label on slots with
    w > 0, False elsewhere).
    """
    w = blocks.weights.reshape(-1)
    rows = (w > 0).nonzero()[:, 0]
    h = hidden.reshape(-1, hidden.shape[-1])[rows]
    y = blocks.labels.reshape(-1)[rows]
    if vocab is not None:
        index = torch.full((head_weight.shape[0],), -1, dtype=torch.long, device=vocab.device)
        index[vocab] = torch.arange(vocab.shape[0], device=vocab.device)
        y = index[y]  # label ids -> columns of the restricted head
        if (y < 0).any():
            raise ValueError("a supervised label is outside `vocab`; the vocabulary must hold every label")
        head_weight = head_weight[vocab]  # [N, D]
    if kd_weight > 0:
        if teacher is None:
            raise ValueError("kd_weight > 0 needs the target's final-normed states (teacher)")
        B, S = teacher.shape[:2]
        where = teacher_positions(blocks) + torch.arange(B, device=teacher.device)[:, None, None] * S  # [B, A, K]
        t = teacher.reshape(B * S, -1)[where.reshape(-1)[rows]]  # [R, D]
    def chunk(h_rows, labels, teacher_rows):  # -> per-row loss, CE and the draft's argmax, each [r]
        logits = F.linear(h_rows, head_weight)  # [r, V] ([r, N] with vocab), in the compute dtype
        ce, top = cross_entropy_and_argmax(logits, labels)  # float32, the fewest passes (cross_entropy.py)
        loss = ce
        if kd_weight > 0:
            with torch.no_grad():
                soft = F.linear(teacher_rows.to(head_weight.dtype), head_weight).float().softmax(-1)  # [r, V or N]
            kd = F.cross_entropy(logits.float(), soft, reduction="none")
            loss = kd if kd_weight == 1 else (1 - kd_weight) * ce + kd_weight * kd
        return loss, ce, top

    chunk_rows = chunk_rows or head_chunk_rows(hidden.device, head_weight.shape[0])
    if recompute is None:  # logits kept per row, and under KD its log-softmax and the teacher's softmax
        kept = rows.shape[0] * head_weight.shape[0] * 4 * (3 if kd_weight > 0 else 1)
        recompute = h.requires_grad and kept > HEAD_MEMORY_BUDGET
    losses, ces = [], []
    hits = torch.zeros(w.shape, dtype=torch.bool, device=hidden.device)
    for start in range(0, rows.shape[0], chunk_rows):
        sl = slice(start, start + chunk_rows)
        args = (h[sl], y[sl], t[sl] if kd_weight > 0 else None)
        loss, ce, top = checkpoint(chunk, *args, use_reentrant=False) if recompute else chunk(*args)
        losses.append(loss)
        ces.append(ce.detach())
        hits[rows[sl]] = top == y[sl]
    factor = w[rows]
    if dpace_alpha is not None and rows.numel():
        ce_slots = torch.zeros(w.shape, device=hidden.device).index_put((rows,), torch.cat(ces))
        factor = dpace_weights(ce_slots.view_as(blocks.weights), blocks.weights, dpace_alpha).reshape(-1)[rows]
    total = hidden.sum() * 0.0  # keeps the graph (and zero grads) when nothing is supervised
    if losses:
        total = total + (torch.cat(losses) * factor).sum()
    return total, hits.view_as(blocks.weights)


def batch_vocab(vocab: torch.Tensor | None, tokens: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor | None:
    """The proposal vocabulary [N] joined with the prompt ids of tokens [B, S] (positions where loss_mask [B, S] is
    0, as the decoder adds a request's prompt ids; padding ids are harmless extras): the ids a training step
    scores. None stays None."""
    return None if vocab is None else with_prompt_tokens(vocab, tokens[loss_mask == 0])


def scored_blocks(blocks: Blocks, vocab: torch.Tensor | None) -> Blocks:
    """`blocks` with weight 0 on every slot whose label is outside `vocab` [N] (sorted ids): a head over those ids
    cannot score it, and the decoder could never propose it. None keeps every slot."""
    if vocab is None:
        return blocks
    inside = torch.isin(blocks.labels, vocab)  # [B, A, K]
    return Blocks(blocks.anchors, blocks.keep, blocks.labels, blocks.weights * inside)


def block_tau(hits: torch.Tensor) -> torch.Tensor:
    """Teacher-forced tau of each block: 1 + sum_k prod_{i<=k} hit_i; hits [..., K-1] bool -> [...] float.

    Averaged over full blocks only (w_{j,K-1} > 0), it is docs/training.md §4's diagnostic; the caller pools the
    sums, so that the mean is over blocks, never a mean of per-batch means.
    """
    return 1.0 + hits.long().cumprod(dim=-1).sum(dim=-1).float()
