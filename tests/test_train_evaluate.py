"""Online evaluation with the real decode loop (blockdraft/train/evaluate.py)."""

from blockdraft.decode.generate import generate
from blockdraft.train.data import read_examples
from blockdraft.train.evaluate import evaluate_online, heldout_prompts

from step_fakes import proposer
from tiny_models import tiny_draft, tiny_target
from train_fakes import write_data


def test_evaluate_online_pools_tau(tmp_path):
    target = tiny_target("llama")
    draft = tiny_draft(target, layers=1, block_size=8)
    write_data(tmp_path / "data", count=5)
    prompts = heldout_prompts(read_examples(tmp_path / "data"))
    assert len(prompts) == 5 and all(p[0] == 1 for p in prompts)
    done = []
    stats = evaluate_online(target, draft, prompts, max_new_tokens=12, block_size=4, batch_size=2,
                            on_batch=done.append)
    assert done == [2, 2, 1], "progress reports each batch's prompt count"
    assert stats.block_size == 4 and len(stats.histogram) == 5, "tau 1..4 and the overflow bin >4"
    alone = generate(target, proposer(target, draft, block_size=4), prompts, max_new_tokens=12)
    assert stats.steps == sum(r.stats.steps for r in alone) and stats.tokens == sum(r.stats.tokens for r in alone)
    assert 1.0 <= stats.mean_tau <= 4.0 and len(stats.per_position_acceptance()) == 3
