"""Two processes serving one GGUF file hold one copy of its weights: each maps the file, and
the page cache holds its pages once (proportional set size counts a shared page half to each)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared.model import cpu_kernels
from shared.model.files import ModelFiles, default_model_file

pytestmark = pytest.mark.slow

# Loads the model as a node does, reads every weight's pages, then waits to be told to exit.
HOLDER = """
import sys
from shared.config import EngineSettings
from shared.engine.factory import load_model
from shared.model.files import resolve_model
from shared.model.layers import BlockEmbedding, Linear

settings = EngineSettings(device="cpu")
model = load_model(settings, resolve_model(None, settings.cache_dir))
total = 0
for m in model.modules():
    if isinstance(m, Linear) and m.ggml is not None:
        total += sum(int(p.blocks.sum()) for p in m.ggml.parts)
    if isinstance(m, BlockEmbedding):
        total += int(m.blocks.blocks.sum())
print("ready", total, flush=True)
sys.stdin.readline()
"""


def mapping_kib(pid: int, path: Path) -> tuple[int, int]:
    """Resident and proportional KiB of process ``pid``'s mappings of ``path``."""
    rss = pss = 0
    inside = False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5:
            inside = len(fields) == 6 and fields[5] == str(path)
        elif inside and fields[0] == "Rss:":
            rss += int(fields[1])
        elif inside and fields[0] == "Pss:":
            pss += int(fields[1])
    return rss, pss


def test_two_processes_hold_one_copy_of_the_weights(
    model_files: ModelFiles, cache_dir: Path
) -> None:
    if not cpu_kernels.load(cache_dir):
        # Without the kernels the weights are expanded to fp32 at load, not mapped.
        pytest.skip("the CPU kernels cannot be built on this machine")
    source = default_model_file().resolve()
    env = dict(os.environ)
    holders = [
        subprocess.Popen(
            [sys.executable, "-c", HOLDER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    try:
        sums = []
        for p in holders:
            assert p.stdout is not None
            word, total = p.stdout.readline().split()
            assert word == "ready"
            sums.append(total)
        assert sums[0] == sums[1]  # both read the same weights
        seen = [mapping_kib(p.pid, source) for p in holders]
    finally:
        for p in holders:
            if p.stdin is not None:
                p.stdin.close()
            p.wait(timeout=60)
    file_kib = source.stat().st_size / 1024
    for rss, _ in seen:
        assert rss > 0.9 * file_kib, seen  # every weight's pages are in, in each process
    together = sum(pss for _, pss in seen)
    assert together < 1.1 * file_kib, (seen, file_kib)
