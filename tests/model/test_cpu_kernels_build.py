"""Building and loading the CPU kernels: cached by content, and a clean fallback when they
cannot be built."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from shared.model import cpu_kernels


def test_the_build_is_cached_under_a_key_of_source_flags_and_torch(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if cpu_kernels._unsupported_reason() is not None:
        pytest.skip("the CPU kernels cannot be built on this machine")
    assert cpu_kernels.load(cache_dir)
    path = cpu_kernels.library_path(cache_dir)
    assert path.is_file() and path.parent == cache_dir / "kernels"
    monkeypatch.setattr(cpu_kernels, "CXXFLAGS", (*cpu_kernels.CXXFLAGS, "-DOTHER"))
    assert cpu_kernels.library_path(cache_dir) != path


def test_a_failed_build_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if cpu_kernels._unsupported_reason() is not None:
        pytest.skip("no compiler to fail with")
    monkeypatch.setattr(cpu_kernels, "CXXFLAGS", ("-DNOT_A_FLAG", "--definitely-not-a-flag"))
    target = cpu_kernels.library_path(tmp_path)
    target.parent.mkdir(parents=True)
    with pytest.raises(RuntimeError):
        cpu_kernels._compile(target)
    assert list(target.parent.iterdir()) == []


def test_unsupported_machines_fall_back_with_a_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(cpu_kernels, "_loaded", None)
    monkeypatch.setenv("CXX", "no-such-compiler-anywhere")
    with caplog.at_level(logging.INFO, logger=cpu_kernels.__name__):
        assert cpu_kernels.load(tmp_path) is False
    assert not (tmp_path / "kernels").exists()
    assert "CPU kernels off" in caplog.text
