"""Arguments shared by several commands, and the checks every command runs before it loads a model."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from ..errors import ConfigError, InputError
from ..prompts import PROMPT_SETS, PromptDataError, benchmark_set_names


def physical_cores() -> int:
    """Cores this process may run on, one thread per physical core (hyper-threads slow small GEMMs down)."""
    try:
        import psutil

        physical = psutil.cpu_count(logical=False)
    except ImportError:
        physical = None
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    logical = os.cpu_count() or available
    # A process limited to some cores (taskset, a container) gets its share of the physical ones.
    return max(1, min(available, round((physical or logical) * available / logical)))


def add_model_arguments(parser) -> None:
    parser.add_argument("--target", default=None,
                        help="a local Hugging Face folder or a hub id (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--draft", default=None, help="draft checkpoint folder (default: the shipped draft)")
    parser.add_argument("--dtype", default="auto", help="auto (bfloat16 on GPUs and on CPUs with native bf16, "
                        "else float32), bfloat16, float32 (exact), float16")
    parser.add_argument("--weights", default="auto", choices=["auto", "q4", "bf16", "fp32"],
                        help="the target's weights: q4 runs the embedded target's GGUF blocks as int4 on CPU (bf16 "
                             "activations); bf16 and fp32 as --dtype; auto: q4 for the embedded target on a CPU where "
                             "the int4 kernel runs when --dtype is auto, else --dtype decides")
    add_compute_arguments(parser)
    parser.add_argument("--full-vocab", action="store_true",
                        help="let the draft propose any token id, ignoring the draft folder's blockdraft_vocab.json")
    parser.add_argument("--no-ngrams", action="store_true",
                        help="ignore the draft folder's blockdraft_ngrams.safetensors (guesses from its training "
                             "answers where prompt lookup finds none)")
    parser.add_argument("--draft-window", type=int, default=None, metavar="W",
                        help="bound the draft's context memory: keep the latest W positions and the first "
                             "--draft-sinks (same output; acceptance may drop at contexts past W); default: all")
    parser.add_argument("--draft-sinks", type=int, default=4, metavar="S",
                        help="first positions the draft window always keeps")


def add_compute_arguments(parser) -> None:
    parser.add_argument("--device", default="auto", help="auto (a CUDA GPU when there is one, else cpu), cpu, cuda, "
                        "cuda:1, ...")
    parser.add_argument("--threads", type=int, default=physical_cores(), metavar="N",
                        help="CPU threads for torch (default: this machine's physical cores); fewer on a busy machine")


def set_compute(args) -> None:
    """Thread count and device (auto: a GPU when there is one), before anything runs."""
    import torch

    from ..io.targets import resolve_device

    if args.threads < 1:
        raise InputError(f"`--threads` must be at least 1, got {args.threads}; pass e.g. --threads {physical_cores()}")
    torch.set_num_threads(args.threads)
    args.device = str(resolve_device(args.device))


def prepare(args) -> None:
    """What every model-loading command does first, in a fraction of a second: thread count and device, then the
    checks that would otherwise fail only after the model load (a missing draft or target folder, a hub id that
    cannot be reached)."""
    set_compute(args)
    if hasattr(args, "weights"):  # --dtype follows --weights; a conflict (or q4 on a CPU without it) is refused here
        from ..io.targets import resolve_weights, weights_dtype

        args.weights = resolve_weights(args.weights, args.dtype, args.target, args.device)
        args.dtype = weights_dtype(args.weights, args.dtype, args.target, args.device)
    if hasattr(args, "dtype") and getattr(args, "weights", None) != "q4":  # q4's bf16 activations pay anyway
        note_bf16(args.dtype, args.device)
    if getattr(args, "draft", None) is not None:
        check_draft_folder(args.draft)
    if getattr(args, "target", None) is not None:
        check_target(args.target)


def note_bf16(dtype, device) -> None:
    """One line on stderr where bf16 runs emulated (a CPU without native bf16 products): slower, still correct."""
    import torch

    from ..io.targets import parse_dtype
    from ..model.kernels import check_bf16_note

    note = check_bf16_note(parse_dtype(dtype, device), torch.device(device))
    if note:
        print(note, file=sys.stderr)


def check_draft_folder(path) -> None:
    """A draft folder that exists and holds a readable config.json."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise InputError(f"--draft {path}: no such folder; pass a draft checkpoint folder (config.json and "
                         "model.safetensors), or leave --draft out for the shipped draft")
    config = folder / "config.json"
    if not config.is_file() or not os.access(config, os.R_OK):
        raise InputError(f"--draft {path}: no readable config.json in it; pass a draft checkpoint folder")


def looks_like_path(name: str) -> bool:
    """Whether a --target names a local folder rather than a hub id ("org/name")."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or os.sep == "\\" and "\\" in name


def check_target(name: str) -> None:
    """A local target folder must exist; a hub id must be in the local cache or the hub reachable (else
    transformers retries for about a minute before failing). Offline with a cached copy, loading stays offline."""
    from ..io.targets import EMBEDDED_TARGET

    if name == EMBEDDED_TARGET:
        return
    if looks_like_path(name) or Path(name).expanduser().exists():
        folder = Path(name).expanduser()
        if not folder.is_dir() or not (folder / "config.json").is_file():
            raise InputError(f"--target {name}: no such folder with a config.json; pass a local Hugging Face model "
                             "folder, a hub id such as HuggingFaceTB/SmolLM2-135M-Instruct, or leave it out for the "
                             "embedded target")
        return
    if _hub_cached(name):
        if not hub_reachable():
            os.environ["HF_HUB_OFFLINE"] = "1"  # use the cached copy at once instead of retrying the network
        return
    if not hub_reachable():
        raise InputError(f"--target {name}: not in the local Hugging Face cache and the hub cannot be reached (no "
                         "network); download it where there is one, or pass a local folder")


def _hub_cached(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # an id the hub library refuses is not cached either; loading will name the problem
        return False


def hub_reachable(timeout: float = 2.0) -> bool:
    """Whether the hub's host accepts a connection within `timeout` seconds."""
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        return False
    host = os.environ.get("HF_ENDPOINT", "https://huggingface.co").split("://")[-1].split("/")[0]
    try:
        with socket.create_connection((host.split(":")[0], 443), timeout=timeout):
            return True
    except OSError:
        return False


def check_port_free(host: str, port: int) -> None:
    """A port another process holds is named before the model load (uvicorn would fail only after it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a port in TIME_WAIT is free
        try:
            probe.bind((host, port))
        except OSError as error:
            raise InputError(f"cannot listen on {host}:{port} ({error.strerror or error}); pass another --port, or "
                             "stop the process that holds it") from error


def context_window(args):
    """The draft context window the flags ask for (cache.ContextWindow), or None for the whole context."""
    from ..cache import ContextWindow

    return None if args.draft_window is None else ContextWindow(args.draft_window, args.draft_sinks)


def add_sampling_arguments(parser, description: str, seed_default: int | None, seed_help: str):
    """The sampling flags (temperature and the filters, in `SamplingParams`' order, and the seed) as one argument
    group, returned for command-specific additions."""
    group = parser.add_argument_group("sampling", description)
    group.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    group.add_argument("--top-p", type=float, default=1.0, help="nucleus mass in (0, 1]; 1 is off")
    group.add_argument("--top-k", type=int, default=0, help="keep the k likeliest tokens; 0 is off")
    group.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min_p * top probability; 0 is off")
    group.add_argument("--seed", type=int, default=seed_default, help=seed_help)
    return group


def add_decode_arguments(parser, what: str = "prompt") -> None:
    """How to decode (decode/options.py), shared by `generate` and `chat`: budget, block size, the three modes and
    the sampling flags. Every mode keeps the output exact; auto is the default of DecodeOptions."""
    from ..decode.selection import SAMPLERS

    parser.add_argument("--max-new-tokens", type=int, default=256, help=f"the most new tokens per {what}")
    parser.add_argument("--block-size", type=int, default=None, help="K (default: the draft's trained block size)")
    parser.add_argument("--adaptive", choices=("auto", "on", "off"), default="auto",
                        help="verify per step the number of proposals that pays best, down to none, priced by step "
                             "costs measured once and cached (same output, the same every run); auto: on")
    parser.add_argument("--lookup", choices=("auto", "on", "off"), default="auto",
                        help="let a step verify a continuation of an earlier occurrence of the last tokens (prompt "
                             "lookup): grafted onto the token tree, or instead of the draft's block without trees, "
                             "when it pays (same output); auto: on")
    parser.add_argument("--drafting", choices=("auto", "on", "off"), default="auto",
                        help="run the draft; off: prompt lookup and the n-gram table alone, their runs verified on "
                             "plain steps (same output; where the draft does not pay, as at --weights q4 on a "
                             "2-core CPU); auto: on")
    parser.add_argument("--tree", choices=("auto", "on", "off"), default="auto",
                        help="verify the draft's likeliest alternatives per slot too, as a token tree in one target "
                             "forward (same output; sampling stays exact); auto: on")
    sampling = add_sampling_arguments(parser, "exact: the output follows the target's own distribution", None,
                                      "prompt i uses seed + i (default: a random seed, printed)")
    sampling.add_argument("--sampler", choices=SAMPLERS, default="auto",
                          help="coupled: each position's token is argmax(log p + g), Gumbel noise g keyed by the "
                               "seed and the position, the draft guessing with the same noise, so a seed gives the "
                               "target-alone sample of that seed (--compare shows identical outputs in float32); "
                               "rejection: the draft samples and p tests its guesses; auto: coupled with --seed")
    sampling.add_argument("--draft-argmax", action="store_true",
                          help="propose the draft's argmax instead of sampling it (rejection sampler; still exact)")
    parser.add_argument("--measure-costs", action="store_true",
                        help="measure the step costs that price adaptive widths again, replacing the cached ones "
                             "(they are measured once per machine; do this after a first run on a busy machine)")


def layer_ids(text: str | None, flag: str, what: str = "layer numbers such as 1,27") -> tuple[int, ...] | None:
    """Comma-separated integers (`--target-layer-ids 1,27`) as a tuple; None for an empty option."""
    if not text:
        return None
    try:
        return tuple(int(i) for i in text.split(","))
    except ValueError as error:
        raise ConfigError(f"{flag} must be comma-separated {what}, got {text!r}") from error


def writable_folder(folder: Path, names: tuple[str, ...]) -> None:
    """Create `folder` and make sure files can be written in it, `names` among them (exit 2 naming it, not a
    traceback later)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise InputError(f"--out {folder} cannot hold the results ({error.strerror or error}); pass a folder "
                         "path that can be created and written") from error
    for name in names:
        if (folder / name).is_dir():
            raise InputError(f"--out {folder} holds a folder named {name}, where the results go; pass another --out")


def refuse_training_sets(prompts) -> None:
    # Drafts are trained on these sets; acceptance measured on them overstates every speedup.
    trained_on = sorted({p.set for p in prompts if p.set in PROMPT_SETS and PROMPT_SETS[p.set].role == "train"})
    if trained_on:
        raise PromptDataError(
            f"prompt set {trained_on[0]!r} is a training set and gives inflated acceptance; "
            f"benchmark on one of {', '.join(benchmark_set_names())} or on your own prompt file"
        )
