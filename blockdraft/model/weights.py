"""A target's weights in one representation, built ready for `Target`: each layer's seven projections, the LM head
and the embedding.

Four representations, one per product the CPU or GPU runs (model/kernels.py decides which run here):
- **hf**: the Hugging Face modules themselves (`F.linear`): float32, GPUs, gradients, any CPU.
- **packed**: bf16 weights packed once for oneDNN's CPU kernels (packed.py), q/k/v and gate/up stacked into one
  product each; the same bits as hf in bf16, faster steps.
- **int4**: each projection's Q4_1 blocks as the GGUF file holds them (q4.py), run by torch's int4 kernel at every
  row count; their bf16 weights are freed.
- **q8 rows**: the tied embedding and head from the file's Q8_0 rows (q8.py), beside packed or int4 layers.

`Target` receives a `TargetWeights` and runs it; it never asks which representation it holds, except to price steps
(decode/costs.py keys costs by `packed` and `quantized`).

Shapes: V vocabulary, D hidden.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..errors import ConfigError
from . import q4, q8
from .packed import PackedConcat, fits_in_memory, head_linear, pack_concat, pack_linear, packing_supported


@dataclass
class TargetWeights:
    """What a target's forward runs. `linears[l]`: layer l's projections by short name (q, k, v, o, gate, up,
    down; or stacked qkv and gate_up), each x [..., D_in] -> [..., D_out]; `products[l]` the same with each packed
    or int4 one as its unchecked product (x 2-D bf16, no gradient), for forwards that checked `packs` once."""

    linears: list[dict]
    products: list[dict]
    packs: list[PackedConcat]  # the packed copies whose staleness a forward checks once
    head: object  # final-normed rows [..., D] -> logits [..., V]
    embed_tokens: torch.nn.Module
    lm_head: torch.nn.Module  # the HF head module (its weight: row_head's rows; meta when q8 rows serve it)
    rows: q8.Q8Rows | None = None  # the file's rows when they serve the embedding and head
    packed: bool = False  # the layers' products are oneDNN-packed bf16
    quantized: bool = False  # the layers' products are int4
    representation: str = field(default="hf")  # hf, packed or int4, "+ q8 rows" when those serve the head


def build_weights(model, *, pack_weights: bool | None = None, quantized: list[dict] | None = None,
                  embedding: q8.Q8Rows | None = None) -> TargetWeights:
    """The weights of HF causal LM `model` in the representation asked for: int4 layers from `quantized` (per layer,
    each projection's Q4_1 blocks), else packed bf16 (`pack_weights`; None: where it runs and its second copy fits
    in a quarter of the machine's memory), else the HF modules; the tied embedding and head from the file's
    `embedding` rows where they can serve."""
    inner = model.model
    layers, lm_head, embed_tokens = inner.layers, model.get_output_embeddings(), inner.embed_tokens
    packable = _can_pack(lm_head, embedding)
    packed = _should_pack(lm_head, layers) if pack_weights is None and packable else bool(pack_weights and packable)
    if quantized is not None:
        linears = _int4_linears(model, layers, quantized)
    else:
        linears = [layer_linears(layer, packed) for layer in layers]
    packs = [f for linear in linears for f in linear.values() if isinstance(f, PackedConcat)]
    products = [{name: f.product if isinstance(f, (PackedConcat, q4.Q4Linear)) else f for name, f in linear.items()}
                for linear in linears]
    tied = getattr(lm_head, "bias", None) is None and lm_head.weight is embed_tokens.weight
    served = (q8.serve_from_rows(model, lm_head.weight, embedding)
              if embedding is not None and q8.rows_can_serve() and tied else None)
    rows = None
    if served is None:
        head = head_linear(lm_head.weight, getattr(lm_head, "bias", None), pack=packed)
    else:  # the file's rows serve the embedding and the head, which are no longer held (q8.py)
        (head, embed_tokens, lm_head), rows = served, embedding
    representation = ("int4" if quantized is not None else "packed" if packed else "hf") + (" + q8 rows" if rows
                                                                                           else "")
    return TargetWeights(linears, products, packs, head, embed_tokens, lm_head, rows, packed,
                         quantized is not None, representation)


def _can_pack(lm_head, embedding: q8.Q8Rows | None) -> bool:
    weight = lm_head.weight
    if weight.is_meta and embedding is not None:  # never read: the file's rows will serve it
        return q8.rows_can_serve()
    return isinstance(lm_head, torch.nn.Linear) and packing_supported(weight)


def _should_pack(lm_head, layers) -> bool:
    linears = [lm_head, *(m for layer in layers for m in projections(layer).values())]
    return fits_in_memory(sum(m.weight.numel() * m.weight.element_size() for m in linears))


def _int4_linears(model, layers, quantized: list[dict]) -> list[dict]:
    """Each layer's projections over int4 weights made from its Q4_1 blocks (q4.py), at every row count; the HF
    model's projection modules become views of the same weights, and their bf16 weights are freed."""
    if len(quantized) != len(layers):  # a GGUF of another model would pair layers wrongly
        raise ConfigError(f"the quantized weights have {len(quantized)} layers, the target {len(layers)}; "
                          "pass the GGUF of this target")
    model.requires_grad_(False)  # frozen: the int4 kernel has no backward, so no input may need one
    linears = []
    for layer, blocks in zip(layers, quantized):
        weights = q4.int4_layer(blocks)
        q4.replace_projections(projections(layer), owners(layer), weights)
        linears.append({name: q4.Q4Linear(weight) for name, weight in weights.items()})
    q4.release_freed_memory()
    return linears


def layer_linears(layer, packed: bool) -> dict:
    """A layer's projections by short name: the HF modules, or packed ones where q/k/v become one "qkv" product
    and gate/up one "gate_up" product (packed.py: same bits) whenever their weights can share one."""
    modules = projections(layer)
    if not packed:
        return modules
    out = {}
    for fused, names in (("qkv", ("q", "k", "v")), ("gate_up", ("gate", "up"))):
        stacked = pack_concat([modules[name] for name in names])
        if stacked is not None:
            out[fused] = stacked
        else:
            out.update({name: pack_linear(modules[name]) for name in names})
    return out | {name: pack_linear(modules[name]) for name in ("o", "down")}


def owners(layer) -> dict:
    """Where each of the seven linears of a Llama/Qwen decoder layer lives: short name -> (module, attribute)."""
    attn, mlp = layer.self_attn, layer.mlp
    return {"q": (attn, "q_proj"), "k": (attn, "k_proj"), "v": (attn, "v_proj"), "o": (attn, "o_proj"),
            "gate": (mlp, "gate_proj"), "up": (mlp, "up_proj"), "down": (mlp, "down_proj")}


def projections(layer) -> dict:
    """The seven linears of a Llama/Qwen decoder layer by short name."""
    mlp = layer.mlp
    modules = {name: getattr(owner, attr, None) for name, (owner, attr) in owners(layer).items()}
    missing = [f"{name}_proj" for name, m in modules.items() if m is None]
    if missing or not hasattr(mlp, "act_fn"):
        raise ConfigError(f"target layer lacks {missing or ['mlp.act_fn']}; blockdraft drives the Llama/Qwen3 "
                          "decoder layout (q/k/v/o_proj, gate/up/down_proj); use a Llama- or Qwen3-family model")
    return modules
