"""The configuration reference in docs/operations.md is what `crescent config-reference`
generates from the settings classes, and it names every CRESCENT_* variable the code uses."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from crescent import config_reference
from crescent.cli import main

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = ROOT / "docs" / "operations.md"


def test_the_reference_in_operations_md_is_current() -> None:
    assert (
        config_reference.replace_section(OPERATIONS.read_text(), config_reference.render())
        == OPERATIONS.read_text()
    ), "run `crescent config-reference --write docs/operations.md`"


def test_every_variable_the_code_names_is_in_the_reference() -> None:
    sources = [p for top in ("shared", "services", "crescent") for p in (ROOT / top).rglob("*.py")]
    named = config_reference.names_in(sources)
    assert len(named) > 40  # the scan sees the code
    assert not named - config_reference.variables()


def test_every_setting_has_a_description() -> None:
    assert config_reference.undescribed() == []


def test_check_fails_on_a_stale_file_and_write_fixes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = tmp_path / "operations.md"
    doc.write_text(f"# Ops\n{config_reference.BEGIN}\n| old |\n{config_reference.END}\ntail\n")
    assert main(["config-reference", "--check", str(doc)]) == 1
    assert "is stale" in capsys.readouterr().err
    assert main(["config-reference", "--write", str(doc)]) == 0
    assert main(["config-reference", "--check", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("# Ops\n") and text.endswith(f"{config_reference.END}\ntail\n")
    assert "| `CRESCENT_KV_CACHE_MB` | `1024` |" in text
    doc.write_text("no markers\n")
    args = argparse.Namespace(write=None, check=doc)
    assert config_reference.run(args) == 2
