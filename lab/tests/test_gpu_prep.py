"""What a GPU window's device calls send (lab/gpu_prep.py): `light` takes the data folders the window does not read
out of git's index so that the tree fits a call, and `restore` puts them back.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gpu_prep  # noqa: E402


def test_light_takes_the_folders_not_carried_out_of_what_travels_and_restore_puts_them_back(tmp_path,
                                                                                          monkeypatch):
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), *args], capture_output=True, check=True, text=True).stdout

    git("init", "-q")
    for name in ("cpu-a", "human-a", "human-b"):
        folder = tmp_path / "datasets" / "t" / name
        folder.mkdir(parents=True)
        (folder / "data-00000.safetensors").write_bytes(b"x" * 1000)
    (tmp_path / "README.md").write_text("r\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "data")
    monkeypatch.setattr(gpu_prep, "REPO", tmp_path)
    before = gpu_prep._travelling_bytes()
    assert gpu_prep.travel_light(SimpleNamespace(keep=[Path("datasets/t/cpu-a")])) == 0
    assert gpu_prep._travelling_bytes() == before - 2000, "the two folders not kept no longer travel"
    assert (tmp_path / "datasets/t/human-b/data-00000.safetensors").is_file(), "their files stay on disk"
    assert gpu_prep.data_folders() == ["datasets/t/cpu-a"]
    assert gpu_prep.travel_light(SimpleNamespace(keep=[Path("datasets/t/nope")])) == 2, "an unknown folder"
    assert gpu_prep.restore(SimpleNamespace()) == 0
    assert gpu_prep._travelling_bytes() == before
    assert git("status", "--porcelain") == "", "the index and the exclude file are as they were"
    assert gpu_prep.data_folders() == ["datasets/t/cpu-a", "datasets/t/human-a", "datasets/t/human-b"]
