"""The `crescent` command line takes flags by their exact names only, and says what it expected
when it gets another: the sub-command's usage, the error and the closest real flag."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from crescent import cli


def refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """What the parser writes to stderr when it refuses ``argv`` (it must, with status 2)."""
    with pytest.raises(SystemExit) as exit_info:
        cli.build_parser().parse_args(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["up", "--prefil", "2"],
        ["up", "--pre", "2"],
        ["up", "--data", "/tmp/x"],
        ["status", "--ur", "http://127.0.0.1:8000"],
        ["generate", "--prompt", "Hi", "--max-tok", "3"],
    ],
)
def test_a_prefix_of_a_flag_is_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert "unrecognized arguments" in refusal(argv, capsys)


def test_no_parser_takes_prefixes() -> None:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert not parser.allow_abbrev
    assert sub.choices, "no sub-commands found"
    for name, command in sub.choices.items():
        assert not command.allow_abbrev, name


def test_a_wrong_flag_prints_the_sub_commands_usage_and_a_suggestion(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = refusal(["up", "--prefil", "2"], capsys)
    assert err.startswith("usage: crescent up ")
    assert "--prefill N" in err and "--with-s3" in err
    assert "crescent up: error: unrecognized arguments: --prefil 2" in err
    assert err.rstrip().endswith("did you mean --prefill?")


def test_a_misspelt_flag_with_a_value_and_a_misspelt_command_get_suggestions(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = refusal(["status", "--interva=3"], capsys)
    assert err.startswith("usage: crescent status ") and "did you mean --interval?" in err
    err = refusal(["stauts"], capsys)
    assert err.startswith("usage: crescent ") and "did you mean status?" in err


def test_a_bad_value_prints_the_sub_commands_usage(capsys: pytest.CaptureFixture[str]) -> None:
    err = refusal(["up", "--port", "eighty"], capsys)
    assert err.startswith("usage: crescent up ")
    assert "crescent up: error: argument --port: invalid int value: 'eighty'" in err
    assert "did you mean" not in err


def test_a_flag_nothing_resembles_gets_no_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    err = refusal(["up", "--zzzzzzzz"], capsys)
    assert "unrecognized arguments: --zzzzzzzz" in err and "did you mean" not in err


def test_exact_flags_still_parse() -> None:
    args = cli.build_parser().parse_args(["up", "--prefill", "2", "--port", "8001"])
    assert (args.prefill, args.port, args.decode) == (2, 8001, 1)


def test_version_names_the_installed_distribution() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "crescent", "--version"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"crescent {metadata.version('crescent')}\n"


def test_version_falls_back_to_pyproject(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(cli.metadata, "version", missing)
    pyproject = Path(cli.__file__).resolve().parents[1] / "pyproject.toml"
    assert cli.version() == tomllib.loads(pyproject.read_text())["project"]["version"]
