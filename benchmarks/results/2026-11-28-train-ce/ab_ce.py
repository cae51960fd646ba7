"""In one process, the store path of `train` with the head loss of before and after train/cross_entropy.py took the
logits as they are (see ab_ce.txt). Run from the repository root with the rounds as argument."""
import sys, tempfile, time, torch, torch.nn.functional as F
from pathlib import Path
torch.set_num_threads(2)
from blockdraft.io.drafts import DEFAULT_DRAFT
from blockdraft.io.targets import load_target
from blockdraft.model.kernels import cpu_paths
from blockdraft.train.data import read_examples, write_shard
from blockdraft.train.feature_store import build_store
from blockdraft.train.trainer import TrainConfig, train
import blockdraft.train.objective as o
target = load_target(weights=None)
scratch = Path(tempfile.mkdtemp(prefix="ab-")); (scratch / "data").mkdir()
write_shard(scratch / "data" / "data-00000.jsonl", read_examples("datasets/smollm2-135m-instruct/gpu-a", target.tokenizer)[:96])
base = dict(data_dirs=scratch / "data", num_draft_layers=2, block_size=4, gamma=4.0, kd_weight=0.0, anchors=96, max_seq_len=640,
            lr=2e-4, epochs=100, max_steps=11, batch_size=8, micro_batch_size=4, save_every=10**6,
            eval_every=10**6, val_fraction=0.0, seed=12, mask_token_id=16, target_layer_ids=(1, 27),
            init_from=str(DEFAULT_DRAFT), standardize_features=True, proposal_vocab=True,
            cpu_autocast=cpu_paths().native_bf16, feature_store=True)
build_store(target, scratch / "data", (1, 27))
new = o.cross_entropy_and_argmax
def old(logits, labels):
    logits = logits.float()
    return F.cross_entropy(logits, labels, reduction="none"), logits.argmax(-1)
res = {"old": [], "new": []}
for r in range(int(sys.argv[1])):
    for name, fn in (("old", old), ("new", new)) if r % 2 == 0 else (("new", new), ("old", old)):
        o.cross_entropy_and_argmax = fn
        marks = []
        train(target, TrainConfig(out_dir=scratch / f"run-{name}-{r}", **base), on_step=lambda s: marks.append(time.perf_counter()))
        res[name].append(round((len(marks) - 1) * 8 * 60 / (marks[-1] - marks[0]), 1))
        print(name, res[name][-1], flush=True)
print(res)
