"""A run's files follow the process umask: records, the manifest and the log."""

import os

import pytest
from experiments import Tiny

import jaxnitro as nx


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_every_file_a_run_writes_follows_the_process_umask(tmp_path, umask):
    run_dir = tmp_path / "run"
    previous = os.umask(umask)
    try:
        nx.Nitro(Tiny(max_epochs=1), run_dir=str(run_dir)).train()
    finally:
        os.umask(previous)
    modes = {
        name: oct(os.stat(run_dir / name).st_mode & 0o777)
        for name in os.listdir(run_dir)
        if (run_dir / name).is_file()
    }
    assert any(name.endswith(".safetensors") for name in modes)
    assert {"manifest.json", "metrics.jsonl"} <= set(modes)
    assert modes == dict.fromkeys(modes, oct(0o666 & ~umask))
