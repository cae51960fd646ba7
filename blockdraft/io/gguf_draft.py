"""Drafts as the DFlash GGUF file that llama.cpp loads (`--spec-type draft-dflash -md DRAFT.gguf`).

The file matches what llama.cpp's own converter writes for a DFlash v1 folder: `convert_hf_to_gguf.py`, class
`DFlashModel` in `conversion/qwen.py` (llama.cpp as vendored in llama-cpp-python 0.3.36), which runs the draft as
a Qwen3-shaped model of architecture `dflash`. Its loader is `llama_model_dflash` in `src/models/dflash.cpp`.

- metadata: the Qwen3 text fields under the `dflash.` prefix, `dflash.block_size`, `dflash.target_layers`
  (our `target_layer_ids` + 1: llama.cpp taps the *input* of the next layer), `tokenizer.ggml.mask_token_id`,
  and the target's tokenizer fields, copied from the target's own GGUF (llama.cpp refuses a draft whose
  vocabulary is not the target's);
- tensors: `fc.weight`, `enc.output_norm.weight` (our `hidden_norm`), `output_norm.weight` (our `norm`) and the
  usual `blk.N.*` names; norms in float32, matrices in f16 or f32 as asked. No embedding and no head: llama.cpp
  reuses the target's, as we do.
- proposal vocabulary (our `blockdraft_vocab.json`), optional: `d2t` (int64, the target id of each draft row)
  and `output.weight`, the target head's rows for those ids copied as stored in the target GGUF (same bytes,
  same quantization), so the draft scores N ids instead of V. llama.cpp scatters the N logits back into V with
  -inf elsewhere (`dflash.cpp`, "reduced-draft-vocab exports"), which is what our draft does. The ids of the
  request's prompt that we add at run time are not in the file: llama.cpp's vocabulary is fixed.

What llama.cpp runs differently is refused before writing (`gguf_problems`). Shapes: V target vocabulary, N
draft vocabulary, D hidden.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..checks import export_layer_problems
from ..config import DraftConfig
from ..errors import CheckpointError
from .gguf import open_gguf

ARCH = "dflash"
GGUF_DTYPES = {"f16": (np.float16, 1), "f32": (np.float32, 0)}  # name -> (numpy type, general.file_type)
# Our tensor name (layer-free part) -> llama.cpp's; `blk.{i}.` prefixes the per-layer ones.
GLOBAL_NAMES = {"fc.weight": "fc.weight", "hidden_norm.weight": "enc.output_norm.weight",
                "norm.weight": "output_norm.weight"}
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
# Target-GGUF fields a draft file carries over: llama.cpp compares the two vocabularies token by token.
TOKENIZER_PREFIX = "tokenizer."


def gguf_name(name: str) -> str:
    """llama.cpp's name for one of our draft tensors, e.g. `layers.1.mlp.up_proj.weight` -> `blk.1.ffn_up.weight`."""
    if name in GLOBAL_NAMES:
        return GLOBAL_NAMES[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "layers" and parts[2] in LAYER_NAMES:
        return f"blk.{parts[1]}.{LAYER_NAMES[parts[2]]}"
    raise CheckpointError(f"draft tensor {name!r} has no place in llama.cpp's DFlash file; "
                          "export a DFlash v1 draft with the standard tensor names (docs/format.md §5)")


def gguf_problems(cfg: DraftConfig) -> list[str]:
    """What llama.cpp's DFlash loader would run differently from blockdraft; each names the field and the fix.
    RoPE needs no check: DraftConfig admits only the default RoPE, which llama.cpp runs too."""
    return export_layer_problems(cfg, "llama.cpp's DFlash loader")


def draft_fields(cfg: DraftConfig, dtype: str) -> dict[str, Any]:
    """The draft's own metadata, as llama.cpp's DFlashModel converter writes it (tokenizer fields aside)."""
    fields = {
        "general.type": "model",
        "general.name": f"blockdraft DFlash draft for {(cfg.provenance or {}).get('target', 'its target')}",
        f"{ARCH}.block_count": cfg.num_hidden_layers,
        f"{ARCH}.context_length": cfg.max_position_embeddings,
        f"{ARCH}.embedding_length": cfg.hidden_size,
        f"{ARCH}.feed_forward_length": cfg.intermediate_size,
        f"{ARCH}.attention.head_count": cfg.num_attention_heads,
        f"{ARCH}.attention.head_count_kv": cfg.num_key_value_heads,
        f"{ARCH}.rope.freq_base": float(cfg.rope_theta),
        f"{ARCH}.attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps),
        f"{ARCH}.attention.key_length": cfg.head_dim,
        f"{ARCH}.attention.value_length": cfg.head_dim,
        "general.file_type": GGUF_DTYPES[dtype][1],
        f"{ARCH}.block_size": cfg.block_size,
        # The converter's `extract_layer_ids = [i + 1 for i in target_layer_ids]`.
        f"{ARCH}.target_layers": [i + 1 for i in cfg.target_layer_ids],
        "general.quantization_version": 2,
        "tokenizer.ggml.mask_token_id": cfg.mask_token_id,
    }
    # The z-lab extras, under the keys the converter gives them (llama.cpp applies them itself).
    for name, key in (("output_multiplier", "logit_scale"), ("final_logit_softcapping", "final_logit_softcapping"),
                      ("input_embedding_scale", "embedding_scale")):
        if getattr(cfg, name) is not None:
            fields[f"{ARCH}.{key}"] = float(getattr(cfg, name))
    return fields


def draft_tensors(cfg: DraftConfig, tensors: dict[str, torch.Tensor], dtype: str) -> dict[str, np.ndarray]:
    """Our tensors under llama.cpp's names: 1-D norms in float32 (as the converter keeps them), matrices in `dtype`."""
    out = {}
    for name in sorted(tensors):
        array = tensors[name].detach().to(torch.float32).cpu().numpy()
        out[gguf_name(name)] = array if array.ndim == 1 else array.astype(GGUF_DTYPES[dtype][0])
    return out


def write_gguf_draft(path: str | Path, cfg: DraftConfig, tensors: dict[str, torch.Tensor], target_gguf: str | Path,
                     dtype: str = "f16", vocab: torch.Tensor | None = None) -> None:
    """Write the draft GGUF at `path`, its tokenizer (and reduced head rows, with `vocab` [N]) from `target_gguf`."""
    import gguf

    if dtype not in GGUF_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(GGUF_DTYPES)}, got {dtype!r}")
    target = open_gguf(Path(target_gguf))
    check_target(cfg, target, Path(target_gguf))
    writer = gguf.GGUFWriter(str(path), ARCH)
    for key, value in draft_fields(cfg, dtype).items():
        _add_field(writer, key, value)
    for field in target.fields.values():
        if field.name.startswith(TOKENIZER_PREFIX) and field.name != "tokenizer.ggml.mask_token_id":
            sub_type = gguf.GGUFValueType(field.types[-1]) if len(field.types) > 1 else None
            writer.add_key_value(field.name, field.contents(), gguf.GGUFValueType(field.types[0]), sub_type)
    for name, array in draft_tensors(cfg, tensors, dtype).items():
        writer.add_tensor(name, array)
    if vocab is not None:
        rows, raw_type = head_rows(target, vocab)
        writer.add_tensor("output.weight", rows, raw_dtype=raw_type)
        writer.add_tensor("d2t", vocab.to(torch.int64).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def check_target(cfg: DraftConfig, target, where: Path) -> None:
    """Refuse a target GGUF the draft does not fit: another vocabulary, width or depth."""
    def value(key: str):
        field = target.fields.get(key)
        return None if field is None else field.contents()

    arch = value("general.architecture")
    problems = []
    if value(f"{arch}.embedding_length") != cfg.hidden_size:
        problems.append(f"hidden size {value(f'{arch}.embedding_length')} is not the draft's {cfg.hidden_size}")
    if value(f"{arch}.block_count") != cfg.num_target_layers:
        problems.append(f"{value(f'{arch}.block_count')} layers, not the draft's num_target_layers "
                        f"{cfg.num_target_layers}")
    tokens = value("tokenizer.ggml.tokens")
    if tokens is None or len(tokens) != cfg.vocab_size:
        problems.append(f"{'no' if tokens is None else len(tokens)} vocabulary entries, not the draft's "
                        f"vocab_size {cfg.vocab_size}")
    if problems:
        raise CheckpointError(f"{where} is not this draft's target: " + "; ".join(problems)
                              + "; pass the GGUF of the target the draft was trained for")


def head_rows(target, vocab: torch.Tensor) -> tuple[np.ndarray, Any]:
    """The target head's rows for `vocab` [N], as stored (quantized rows are independent blocks along D)."""
    by_name = {t.name: t for t in target.tensors}
    # A tied target has no output.weight: its head is the token embedding.
    head = by_name.get("output.weight", by_name.get("token_embd.weight"))
    if head is None:
        raise CheckpointError("the target GGUF has neither output.weight nor token_embd.weight; "
                              "pass the target's complete GGUF")
    data = np.asarray(head.data)  # [V, D] floats, or [V, bytes per row] for a quantized type
    rows = np.ascontiguousarray(data[vocab.numpy()])  # [N, ...]
    # Float rows carry their own type; quantized ones are bytes that need the type named.
    return rows, None if rows.dtype in (np.float32, np.float16) else head.tensor_type


def _add_field(writer, key: str, value) -> None:
    import gguf

    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    else:  # target_layers: the converter writes an INT32 array
        writer.add_key_value(key, list(value), gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32)


def read_gguf_draft(path: str | Path) -> dict[str, Any]:
    """The fields of a DFlash draft GGUF that decide how llama.cpp runs it, for `inspect`."""
    reader = open_gguf(Path(path))
    fields = {f.name: f.contents() for f in reader.fields.values()
              if not f.name.startswith(TOKENIZER_PREFIX) or f.name == "tokenizer.ggml.mask_token_id"}
    if fields.get("general.architecture") != ARCH:
        raise CheckpointError(f"{path} is a GGUF of architecture {fields.get('general.architecture')!r}, "
                              f"not a DFlash draft ({ARCH!r}); pass a file from `blockdraft export --to gguf`")
    tensors = {t.name: (t.tensor_type.name, [int(n) for n in t.shape]) for t in reader.tensors}
    vocab = tensors.get("d2t", (None, [None]))[1][0]
    return {"fields": fields, "tensors": tensors, "draft_vocab": vocab,
            "vocabulary_entries": len(reader.fields["tokenizer.ggml.tokens"].contents())
            if "tokenizer.ggml.tokens" in reader.fields else 0}
