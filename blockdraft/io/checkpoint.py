"""Draft checkpoint folders (docs/format.md §1-2, §5-6): `config.json` plus safetensors, single file or HF shards.

Reading checks every tensor name, dtype and shape from the safetensors headers before any weight is
allocated, then refuses non-finite values. Only safetensors is ever read or written (no pickle).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from ..config import ARCHITECTURE, DraftConfig
from ..errors import CheckpointError, ConfigError
from .hf_export import (
    from_transformers_config,
    is_transformers_config,
    native_tensor_name,
    to_transformers_config,
    to_transformers_tensors,
)
from ..checks import canonical_tensor_names, raise_collected, tensor_problems

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
SHARD_PATTERN = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
# Bytes per element of the safetensors dtypes, to check that each tensor's byte span matches its shape.
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
               "U16": 2, "U32": 4, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1}
TORCH_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}
MAX_HEADER_BYTES = 100 * 2**20  # safetensors' own limit; a larger length field means a garbage file


def expected_tensor_shapes(cfg: DraftConfig) -> dict[str, tuple[int, ...]]:
    """docs/format.md §2: every tensor of a draft with this config and its shape (11ℓ+3, plus 4ℓ biases)."""
    D, I, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    shapes = {"fc.weight": (D, len(cfg.target_layer_ids) * D), "hidden_norm.weight": (D,), "norm.weight": (D,)}
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (D,), p + "post_attention_layernorm.weight": (D,),
            p + "self_attn.q_proj.weight": (q, D), p + "self_attn.k_proj.weight": (kv, D),
            p + "self_attn.v_proj.weight": (kv, D), p + "self_attn.o_proj.weight": (D, q),
            p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
            p + "mlp.gate_proj.weight": (I, D), p + "mlp.up_proj.weight": (I, D), p + "mlp.down_proj.weight": (D, I),
        })
        if cfg.attention_bias:
            shapes.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                           p + "self_attn.v_proj.bias": (kv,), p + "self_attn.o_proj.bias": (D,)})
    return shapes


# ---------------------------------------------------------------------------------------------------------
# Reading


def read_config(path: str | Path) -> DraftConfig:
    """The validated DraftConfig of a checkpoint folder, ours or transformers' DFlash form (io/hf_export.py)."""
    return _read_config(Path(path))[0]


def _read_config(folder: Path) -> tuple[DraftConfig, bool]:
    """(config, whether the folder is in transformers' form, whose tensor names differ from ours)."""
    if not folder.is_dir():
        raise CheckpointError(f"draft checkpoint folder {folder} does not exist or is not a folder; pass the "
                              f"folder that holds {CONFIG_FILE} and the safetensors weights")
    file = folder / CONFIG_FILE
    if not file.is_file():
        raise CheckpointError(f"{file} is missing; a draft folder needs {CONFIG_FILE} beside its weights")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{file} is not valid JSON ({error}); restore it from the draft's release") from None
    transformers = is_transformers_config(data)
    try:
        return DraftConfig.from_dict(from_transformers_config(data) if transformers else data), transformers
    except ConfigError as error:
        raise ConfigError(f"{file}: {error}") from None


def read_checkpoint(path: str | Path, *,
                    dtype: torch.dtype | None = None) -> tuple[DraftConfig, dict[str, torch.Tensor]]:
    """Load a draft folder: (config, state dict with docs/format.md §2 names), tensors cast to `dtype` if given."""
    folder = Path(path)
    cfg, transformers = _read_config(folder)
    files, weight_map = _weight_files(folder)
    headers = {file: read_safetensors_header(file) for file in files}
    problems = _index_problems(weight_map, headers) if weight_map is not None else []
    where = {stored: file for file, header in headers.items() for stored in header}
    names, more = canonical_tensor_names(list(where))
    problems += more
    if transformers:
        names = {native_tensor_name(name): stored for name, stored in names.items()}
    found = {name: headers[where[stored]][stored] for name, stored in names.items()}
    expected = expected_tensor_shapes(cfg)
    problems += tensor_problems(expected, found)
    raise_collected(problems, CheckpointError)
    tensors = _load(names, where)
    raise_collected(nonfinite_problems(tensors), CheckpointError)
    return cfg, {name: tensors[name] if dtype is None else tensors[name].to(dtype) for name in expected}


def _weight_files(folder: Path) -> tuple[list[Path], dict[str, str] | None]:
    single, index = folder / WEIGHTS_FILE, folder / INDEX_FILE
    if single.exists() and index.exists():
        # Which of the two belongs to config.json is unknown; loading either could pick stale weights.
        raise CheckpointError(f"{folder} holds both {WEIGHTS_FILE} and {INDEX_FILE}; delete the stale one")
    if single.is_file():
        return [single], None
    if not index.is_file():
        raise CheckpointError(f"{folder} has neither {WEIGHTS_FILE} nor {INDEX_FILE}; add the draft's weights")
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as error:
        raise CheckpointError(f"{index} is corrupt (no valid JSON `weight_map`: {error!r}); re-download it") from None
    shards = list(weight_map.values()) if isinstance(weight_map, dict) else [weight_map]
    bad = [f for f in shards if not isinstance(f, str) or Path(f).name != f or f in ("", ".", "..")]
    if bad:
        # A shard name with a path in it could read any file on disk.
        raise CheckpointError(f"{index} `weight_map` must map tensor names to shard file names in the folder, "
                              f"got {bad[:3]}; re-download the index")
    missing = sorted(f for f in set(weight_map.values()) if not (folder / f).is_file())
    if missing:
        raise CheckpointError(f"{index} lists shards {missing}, which are missing from {folder}; download them")
    return [folder / f for f in sorted(set(weight_map.values()))], weight_map


def _index_problems(weight_map: dict[str, str], headers: dict[Path, dict]) -> list[str]:
    # An index that disagrees with its shards means a mixed or partial download.
    problems = []
    for name, shard in weight_map.items():
        if not any(file.name == shard and name in header for file, header in headers.items()):
            problems.append(f"{INDEX_FILE} puts tensor `{name}` in {shard}, which does not hold it; the shards "
                            "and index are mixed up; re-download them together")
    for file, header in headers.items():
        strays = sorted(name for name in header if weight_map.get(name) != file.name)
        if strays:
            problems.append(f"{file.name} holds tensors {strays} that {INDEX_FILE} does not map to it; the shards "
                            "and index are mixed up; re-download them together")
    return problems


def read_safetensors_header(file: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{stored name: (dtype, shape)} from a safetensors header, after checking it against the file size."""
    def corrupt(why: str) -> CheckpointError:
        return CheckpointError(f"{file} is corrupt ({why}); re-download or re-save the checkpoint")

    size = file.stat().st_size
    with open(file, "rb") as handle:
        length = int.from_bytes(handle.read(8).ljust(8, b"\0"), "little")
        if size < 8 or length > min(size - 8, MAX_HEADER_BYTES):
            raise corrupt(f"header length {length} does not fit a {size}-byte file")
        raw = handle.read(length)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise corrupt("its header is not JSON") from None
    if not isinstance(header, dict):
        raise corrupt("its header is not a JSON object")
    header.pop("__metadata__", None)
    data_bytes, end_max, out = size - 8 - length, 0, {}
    for name, info in header.items():
        try:
            dtype, shape, (start, end) = info["dtype"], tuple(int(n) for n in info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise corrupt(f"header entry {name!r} lacks dtype, shape or data_offsets") from None
        if not (isinstance(start, int) and isinstance(end, int) and 0 <= start <= end <= data_bytes):
            raise corrupt(f"tensor {name!r} spans bytes {start}..{end} of {data_bytes} (truncated file?)")
        if dtype in DTYPE_BYTES and end - start != math.prod(shape) * DTYPE_BYTES[dtype]:
            raise corrupt(f"tensor {name!r} holds {end - start} bytes, not {dtype} {list(shape)}")
        end_max = max(end_max, end)
        out[name] = (dtype, shape)
    if end_max != data_bytes:
        raise corrupt(f"tensor data ends at byte {end_max} but the file holds {data_bytes} data bytes")
    return out


def _load(names: dict[str, str], where: dict[str, Path]) -> dict[str, torch.Tensor]:
    """Read only the wanted tensors (never the ignored embedding/head copies), each file opened once."""
    tensors = {}
    for file in dict.fromkeys(where.values()):
        wanted = {name: stored for name, stored in names.items() if where[stored] == file}
        try:
            with safe_open(file, framework="pt") as handle:
                tensors.update({name: handle.get_tensor(stored) for name, stored in wanted.items()})
        except (SafetensorError, OSError, RuntimeError) as error:
            raise CheckpointError(f"{file} is corrupt ({error}); re-download or re-save the checkpoint") from None
    return tensors


def nonfinite_problems(tensors: dict[str, torch.Tensor]) -> list[str]:
    """A NaN or inf weight turns every draft into garbage without an error; name each such tensor."""
    problems = []
    for name, tensor in tensors.items():
        bad = int((~torch.isfinite(tensor)).sum())
        if bad:
            problems.append(f"tensor `{name}` has {bad} NaN/inf values; the draft is damaged or diverged in "
                            "training; re-export it from a healthy training step")
    return problems


# ---------------------------------------------------------------------------------------------------------
# Writing


def write_checkpoint(path: str | Path, cfg: DraftConfig, state_dict: dict[str, torch.Tensor], *,
                     dtype: torch.dtype = torch.bfloat16, max_shard_size: int = 15 * 2**20) -> None:
    """Write `config.json` (docs/format.md §5) and the §2 tensors as safetensors, HF-sharded above `max_shard_size`."""
    if dtype not in TORCH_DTYPES:
        raise CheckpointError(f"checkpoint dtype must be one of {list(TORCH_DTYPES)}, got {dtype}; pass a float dtype")
    expected = expected_tensor_shapes(cfg)
    found = {name: (TORCH_DTYPES.get(t.dtype, str(t.dtype)), tuple(t.shape)) for name, t in state_dict.items()}
    raise_collected(tensor_problems(expected, found), CheckpointError)
    # Copies: safetensors refuses tensors that share storage, and the caller's tensors stay untouched.
    tensors = {name: state_dict[name].detach().to(device="cpu", dtype=dtype, copy=True).contiguous()
               for name in expected}
    raise_collected(nonfinite_problems(tensors), CheckpointError)
    folder = Path(path)
    _prepare_folder(folder)
    shards = _plan_shards(tensors, max_shard_size)
    if len(shards) == 1:
        save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    else:
        weight_map = {}
        for number, shard in enumerate(shards, start=1):
            name = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(folder / name), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(shard, name))
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (folder / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    config = cfg.to_dict(dtype=str(dtype).removeprefix("torch."))
    # dflash.py is not shipped, and an auto_map naming a missing file breaks AutoModel(trust_remote_code=True);
    # without it HF readers load the folder as plain Qwen3 (docs/format.md §4) and engines ignore it.
    del config["auto_map"]
    # Written last: a folder whose config.json exists has complete weights.
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def _prepare_folder(folder: Path) -> None:
    # Old weights of the other layout would make the folder ambiguous; remove them, but only from a folder
    # that holds a draft, never from (say) a target's folder passed by mistake.
    folder.mkdir(parents=True, exist_ok=True)
    stale = [f for f in folder.iterdir() if f.name in (WEIGHTS_FILE, INDEX_FILE) or SHARD_PATTERN.fullmatch(f.name)]
    if not stale:
        return
    if not is_draft_folder(folder):
        raise CheckpointError(f"{folder} already holds model weights that are not a DFlash draft "
                              f"({stale[0].name}); write the draft to an empty folder")
    (folder / CONFIG_FILE).unlink()
    for file in stale:
        file.unlink()


def is_draft_folder(folder: Path) -> bool:
    """Whether `folder`'s config.json names a DFlash draft (a folder that may be overwritten by another draft)."""
    try:
        config = json.loads((Path(folder) / CONFIG_FILE).read_text(encoding="utf-8"))
        return ARCHITECTURE in config.get("architectures", [])
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError, TypeError):
        return False


def _plan_shards(tensors: dict[str, torch.Tensor], max_shard_size: int) -> list[dict[str, torch.Tensor]]:
    # Greedy in §2 order: a new shard starts when the next tensor would pass the limit (HF's rule); one
    # tensor larger than the limit gets a shard of its own.
    shards: list[dict[str, torch.Tensor]] = [{}]
    used = 0
    for name, tensor in tensors.items():
        size = tensor.numel() * tensor.element_size()
        if shards[-1] and used + size > max_shard_size:
            shards.append({})
            used = 0
        shards[-1][name] = tensor
        used += size
    return shards


def write_transformers_checkpoint(path: str | Path, cfg: DraftConfig, state_dict: dict[str, torch.Tensor]) -> None:
    """Write a draft in the form transformers' DFlash class loads (io/hf_export.py) into an empty folder.

    Tensors keep their dtype. One safetensors file: `from_pretrained` reads a file of any size.
    """
    config = to_transformers_config(cfg, dtype=_one_dtype(state_dict))  # refuses what transformers runs otherwise
    expected = expected_tensor_shapes(cfg)
    found = {name: (TORCH_DTYPES.get(t.dtype, str(t.dtype)), tuple(t.shape)) for name, t in state_dict.items()}
    raise_collected(tensor_problems(expected, found), CheckpointError)
    tensors = {name: state_dict[name].detach().to("cpu").contiguous() for name in expected}
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(to_transformers_tensors(tensors), str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    # Written last, as in write_checkpoint: a folder whose config.json exists has complete weights.
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def _one_dtype(state_dict: dict[str, torch.Tensor]) -> str:
    dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in state_dict.values()})
    if len(dtypes) != 1:
        raise CheckpointError(f"draft tensors must share one dtype, got {dtypes}; cast them to one before writing")
    return dtypes[0]
