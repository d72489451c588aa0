"""Cores and threads of a model process: the core lists, the settings and their effect."""

from __future__ import annotations

import os

import pydantic
import pytest
import torch

from shared.config import EngineSettings
from shared.cpus import parse_cpus
from shared.engine.threads import apply_thread_settings


def test_core_lists_read_as_linux_writes_them() -> None:
    assert parse_cpus("0-3,6") == {0, 1, 2, 3, 6}
    assert parse_cpus("5") == {5}
    for bad in ("3-1", "a", "1-", "-2", "1,,2", ""):
        with pytest.raises(ValueError):
            parse_cpus(bad)


def test_the_settings_refuse_a_bad_core_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRESCENT_CPU_AFFINITY", "2-0")
    with pytest.raises(pydantic.ValidationError, match="runs backwards"):
        EngineSettings()
    monkeypatch.setenv("CRESCENT_CPU_AFFINITY", "0")
    monkeypatch.setenv("CRESCENT_NUM_THREADS", "1")
    settings = EngineSettings()
    assert (settings.cpu_affinity, settings.num_threads) == ("0", 1)


def test_threads_default_to_the_cores_the_process_may_use() -> None:
    before_threads, before_cpus = torch.get_num_threads(), os.sched_getaffinity(0)
    try:
        assert apply_thread_settings(1, None) == 1 and torch.get_num_threads() == 1
        one = min(before_cpus)
        assert apply_thread_settings(None, str(one)) == 1
        assert os.sched_getaffinity(0) == {one} and torch.get_num_threads() == 1
    finally:
        os.sched_setaffinity(0, before_cpus)
        torch.set_num_threads(before_threads)
