"""Acceptance math for one speculative step: which proposals to keep and which token the target adds.

Notation (docs/design.md §2-3): p is the target's distribution and q the draft's, both made by the same
`logits_to_probs` transform. Every function here maps tensors to tensors; no model, cache or config.

- block: K consecutive slots 0..K-1, at positions s..s+K-1, drafted and verified together.
- anchor: slot 0, the newest committed token x[s].
- proposal: d_j for slots j = 1..K-1, the draft's token, drawn from q_j (or its argmax: then q_j is one-hot).
- verify slot: the target's distribution p_j at slot j is for the token at slot j+1, so d_j is judged by p_{j-1}.
- accepted: d_j is accepted with probability min(1, p_{j-1}(d_j) / q_j(d_j)). num_accepted = a is the number of
  proposals before the first rejection (K-1 when none is rejected); d_1..d_a are committed.
- replacement: when d_{a+1} is rejected, the target's token for slot a+1 is drawn from the residual
  norm(max(0, p_a - q_{a+1})) instead.
- bonus: the one token the target contributes per step, at slot a+1: the replacement after a rejection, or a draw
  from p_{K-1} when all K-1 proposals were accepted. It becomes the next anchor.
- tau = a + 1: tokens committed per step, in [1, K].

Tensor layout. p is [B, K, V] with p[:, i] = p_i. q, draft_tokens and uniforms hold K-1 entries per row, entry i
for slot i+1: q[:, i] = q_{i+1}, draft_tokens[:, i] = d_{i+1}. So proposal i is judged by p[:, i] against q[:, i],
and after a accepted proposals the replacement comes from residual(p[:, a], q[:, a]).

Randomness comes in as uniforms or from generators (transforms.draw_uniforms): per row, K uniforms in a fixed
order, the K-1 acceptance tests first and then the one for the bonus token. The committed tokens are then
distributed exactly as sampling from p token by token (Leviathan et al. 2023; Chen et al. 2023).

Shapes: B rows, K block size, V vocabulary.
"""

from __future__ import annotations

import math

import torch

from ..errors import InputError
from .argmax import first_argmax
from .transforms import Generators, draw_uniforms, sample_from_uniforms


def _shape_error(name: str, want: str, got: torch.Tensor, context: str, fix: str) -> InputError:
    return InputError(f"`{name}` must have shape {want}{context}, got {list(got.shape)}; {fix}")


def _check_block(p: torch.Tensor, q: torch.Tensor, draft_tokens: torch.Tensor | None) -> tuple[int, int, int]:
    """Shapes of one verified block; returns B, K, V. Catches off-by-one slot layouts before they index garbage."""
    if p.dim() != 3 or p.shape[1] < 1:
        raise _shape_error("p", "[B, K, V] with K >= 1", p, "", "pass the target's distributions for slots 0..K-1")
    B, K, V = p.shape
    context = f" to match p {list(p.shape)}"
    if tuple(q.shape) != (B, K - 1, V):
        raise _shape_error("q", f"[B, K-1, V] = {[B, K - 1, V]}", q, context,
                           "pass the draft's distributions for slots 1..K-1 only")
    if draft_tokens is not None and tuple(draft_tokens.shape) != (B, K - 1):
        raise _shape_error("draft_tokens", f"[B, K-1] = {[B, K - 1]}", draft_tokens, context,
                           "pass the proposals d_1..d_(K-1), without the anchor")
    return B, K, V


def greedy_accept_length(draft_tokens: torch.Tensor, target_tokens: torch.Tensor) -> torch.Tensor:
    """Longest prefix of proposals equal to the target's argmax one slot earlier -> num_accepted [B].

    target_tokens[:, j] is the target's argmax at verify slot j, the token for slot j+1, so it is compared with
    draft_tokens[:, j] = d_{j+1}. All K-1 agree -> K-1.
    """
    # [B, K-1], [B, K] -> [B]
    if draft_tokens.dim() != 2 or tuple(target_tokens.shape) != (draft_tokens.shape[0], draft_tokens.shape[1] + 1):
        raise InputError(f"`draft_tokens` [B, K-1] and `target_tokens` [B, K] disagree: got "
                         f"{list(draft_tokens.shape)} and {list(target_tokens.shape)}; pass the target's tokens for "
                         "all K verify slots 0..K-1 and the K-1 proposals of the same rows")
    agree = (draft_tokens == target_tokens[:, :-1]).long()  # [B, K-1]
    # cumprod turns [1, 1, 0, 1] into [1, 1, 0, 0]: agreements after the first miss do not count.
    return agree.cumprod(dim=1).sum(dim=1)


def greedy_step(target_logits: torch.Tensor, draft_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Temperature 0: the agreeing prefix, then the target's argmax at slot a -> (num_accepted, bonus_token)."""
    # [B, K, V], [B, K-1] -> [B], [B]
    if target_logits.dim() != 3:
        raise _shape_error("target_logits", "[B, K, V]", target_logits, "",
                           "pass the target's logits for the whole block")
    target_tokens = first_argmax(target_logits)  # [B, K]
    num_accepted = greedy_accept_length(draft_tokens, target_tokens)
    bonus_token = target_tokens.gather(1, num_accepted[:, None]).squeeze(1)
    return num_accepted, bonus_token


def rejection_accept(p: torch.Tensor, q: torch.Tensor, draft_tokens: torch.Tensor, uniforms: torch.Tensor
                     ) -> torch.Tensor:
    """Accept d_j iff u_j < min(1, p_{j-1}(d_j) / q_j(d_j)); num_accepted [B] is the first rejection's index."""
    # [B, K, V], [B, K-1, V], [B, K-1], [B, K-1] -> [B]
    B, K, _ = _check_block(p, q, draft_tokens)
    if tuple(uniforms.shape) != (B, K - 1):
        raise _shape_error("uniforms", f"[B, K-1] = {[B, K - 1]}", uniforms, f" to match p {list(p.shape)}",
                           "pass one uniform per proposal")
    index = draft_tokens.long().unsqueeze(-1)  # [B, K-1, 1]
    # float64: the comparison below then matches a plain Python float reference bit for bit.
    p_d = p[:, :-1].gather(-1, index).squeeze(-1).double()  # [B, K-1]: p_{j-1}(d_j)
    q_d = q.gather(-1, index).squeeze(-1).double()  # [B, K-1]: q_j(d_j)
    # q_j(d_j) = 0 cannot happen for a token drawn from q_j; if it is passed anyway, any target mass accepts
    # (ratio +inf) and no target mass rejects (ratio 0), instead of dividing by zero into NaN.
    ratio = torch.where(q_d > 0, p_d / q_d, torch.where(p_d > 0, math.inf, 0.0))
    accepted = uniforms.double() < ratio.clamp(max=1.0)  # [B, K-1]
    return accepted.long().cumprod(dim=1).sum(dim=1)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The replacement distribution norm(max(0, p - q)).

    Its mass is the rejection probability. Mass 0 means p <= q everywhere, i.e. p == q: then no proposal is ever
    rejected and any choice is exact, so p is returned instead of 0/0 = NaN. When p and q differ only by float
    rounding the residual is noise, but it is drawn with a probability of the same rounding size.
    """
    # [..., V], [..., V] -> [..., V]
    if p.shape != q.shape:
        raise InputError(f"`p` and `q` must have the same shape, got {list(p.shape)} and {list(q.shape)}; "
                         "pass the target and draft distributions of the same slot")
    excess = (p - q).clamp(min=0.0)  # [..., V]
    mass = excess.sum(dim=-1, keepdim=True)  # [..., 1]
    return torch.where(mass > 0, excess / mass, p)


def sample_bonus(p: torch.Tensor, q: torch.Tensor, num_accepted: torch.Tensor, uniforms: torch.Tensor
                 ) -> torch.Tensor:
    """The target's token at slot a+1: replacement from residual(p_a, q_{a+1}), or from p_{K-1} if a = K-1."""
    # [B, K, V], [B, K-1, V], [B], [B] -> [B]
    B, K, _ = _check_block(p, q, None)
    if tuple(num_accepted.shape) != (B,) or tuple(uniforms.shape) != (B,):
        raise InputError(f"`num_accepted` and `uniforms` must have shape [B] = [{B}] to match p {list(p.shape)}, "
                         f"got {list(num_accepted.shape)} and {list(uniforms.shape)}; pass one value per row")
    rows = torch.arange(B, device=p.device)
    p_a = p[rows, num_accepted]  # [B, V]: the target's distribution for slot a+1
    if K == 1:  # empty block: no proposal, the bonus comes straight from p_0
        return sample_from_uniforms(p_a, uniforms)
    q_a = q[rows, num_accepted.clamp(max=K - 2)]  # [B, V]
    # After all K-1 accepted there is no proposal to correct: q = 0 turns the residual into p_{K-1} itself.
    q_a = q_a.masked_fill((num_accepted == K - 1).unsqueeze(-1), 0.0)
    return sample_from_uniforms(residual(p_a, q_a), uniforms)


def speculative_sample_from_uniforms(p: torch.Tensor, q: torch.Tensor, draft_tokens: torch.Tensor,
                                     uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One step's acceptance with explicit randomness -> (num_accepted [B], bonus_token [B]).

    uniforms[:, :K-1] drive the acceptance tests and uniforms[:, K-1] draws the bonus token.
    """
    # [B, K, V], [B, K-1, V], [B, K-1], [B, K] -> [B], [B]
    B, K, _ = _check_block(p, q, draft_tokens)
    if tuple(uniforms.shape) != (B, K):
        raise _shape_error("uniforms", f"[B, K] = {[B, K]}", uniforms, f" to match p {list(p.shape)}",
                           "pass K-1 acceptance uniforms and one for the bonus token per row")
    # 1. Accept: test proposals left to right; the first rejection ends the block.
    num_accepted = rejection_accept(p, q, draft_tokens, uniforms[:, :-1])
    # 2. Bonus: a replacement from the residual, or a fresh draw from p_{K-1} after a full block.
    bonus_token = sample_bonus(p, q, num_accepted, uniforms[:, -1])
    return num_accepted, bonus_token


def speculative_sample(p: torch.Tensor, q: torch.Tensor, draft_tokens: torch.Tensor, generator: Generators = None,
                       limits: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One step's acceptance -> (num_accepted [B], bonus_token [B]); the main entry point of this module.

    `generator` is one torch.Generator for the batch, a list with one per row (a row then gives the same result
    alone or in any batch), or None for torch's global generator. Each row draws K uniforms per call.
    `limits` [B] (a ragged block): row b proposed only its first limits[b] tokens, the rest is padding, which
    its p was not computed for (`limited`).
    """
    # [B, K, V], [B, K-1, V], [B, K-1] -> [B], [B]
    B, K, _ = _check_block(p, q, draft_tokens)
    uniforms = draw_uniforms(generator, (B, K), p.device)  # [B, K]
    if limits is not None:
        q, uniforms = limited(q, uniforms, limits)
    return speculative_sample_from_uniforms(p, q, draft_tokens, uniforms)


def limited(q: torch.Tensor, uniforms: torch.Tensor, limits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A block whose row b proposed only its first limits[b] tokens, as the block of those alone: every padding
    proposal is rejected (its uniform raised to 2, above any acceptance probability), and its q is 0, so that the
    draw after the last real proposal comes from residual(p, 0) = p, the bonus of a block of limits[b]
    proposals. Each row still draws K uniforms: its random stream is the same whatever its limit."""
    # [B, K-1, V], [B, K], [B] -> [B, K-1, V], [B, K]
    padding = torch.arange(q.shape[1], device=q.device)[None, :] >= limits[:, None]  # [B, K-1]
    tests = uniforms[:, :-1].masked_fill(padding, 2.0)
    return q.masked_fill(padding[..., None], 0.0), torch.cat([tests, uniforms[:, -1:]], dim=1)
