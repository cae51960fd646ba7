"""benchmarks/train_throughput.py with the head's loss of before 2026-11-28: the same script as
2026-11-28-train-ce/before.py (kept there since the loss's interface changed). Run from the repository root."""
import runpy

runpy.run_path("benchmarks/results/2026-11-28-train-ce/before.py", run_name="__main__")
