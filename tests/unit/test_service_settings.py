"""The common base of the settings classes, and the small classes that read one module's
variables: names, defaults and parsing as before they had a class."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import Field, ValidationError

from crescent.cli_settings import BenchKeySettings, CliSettings, named_variable
from shared.flag_settings import ProcessFlags
from shared.model.settings import CacheDirSettings, CompilerSettings
from shared.service_settings import ServiceSettings, child_environment
from shared.tracing_settings import TracingSettings

SECRET = "a-value-no-error-may-show"


class Sample(ServiceSettings):
    port: int = Field(default=1, description="a number")
    names: list[str] = Field(default_factory=list, description="a list, as JSON")


def test_fields_read_prefixed_variables_in_any_case_and_ignore_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("crescent_port", "7")
    monkeypatch.setenv("CRESCENT_NOT_A_FIELD", "x")
    monkeypatch.setenv("PORT", "9")
    assert Sample().port == 7


def test_an_error_never_echoes_the_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRESCENT_PORT", SECRET)
    with pytest.raises(ValidationError) as caught:
        Sample()
    assert SECRET not in str(caught.value) and "port" in str(caught.value)


def test_from_environ_reads_only_the_mapping_by_the_same_rules(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CRESCENT_PORT", "7")
    assert Sample.from_environ({}).port == 1
    given = Sample.from_environ({"Crescent_Port": "8", "CRESCENT_NAMES": '["a", "b"]'})
    assert (given.port, given.names) == (8, ["a", "b"])
    assert Sample.from_environ().port == 7


def test_a_child_environment_is_a_copy_with_the_extra_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CRESCENT_PORT", "7")
    env = child_environment({"CRESCENT_UP_ID": "u"})
    assert env["CRESCENT_PORT"] == "7" and env["CRESCENT_UP_ID"] == "u"
    env["CRESCENT_PORT"] = "8"
    assert child_environment()["CRESCENT_PORT"] == "7"


@pytest.mark.parametrize(
    ("raw", "expected"), [(" ", False), ("no", False), ("on", True), (" TRUE ", True)]
)
def test_flags_parse_like_a_bool_and_blank_is_false(raw: str, expected: bool) -> None:
    flags = ProcessFlags.read({"CRESCENT_DEV_MODE": raw, "CRESCENT_LOG_PROMPTS": raw})
    assert flags.dev_mode is expected and flags.log_prompts is expected


def test_a_malformed_flag_is_named_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"^CRESCENT_LOG_PROMPTS must be true or false, got 'x'$"):
        ProcessFlags.read({"CRESCENT_LOG_PROMPTS": "x"})


def test_the_cache_folder_and_the_compiler_keep_their_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CRESCENT_CACHE_DIR", raising=False)
    monkeypatch.delenv("CXX", raising=False)
    assert CacheDirSettings().folder() == Path.home() / ".cache" / "crescent"
    assert CompilerSettings().compiler() == "g++"
    monkeypatch.setenv("CRESCENT_CACHE_DIR", "~/elsewhere")
    monkeypatch.setenv("CXX", "clang++")
    assert CacheDirSettings().folder() == Path.home() / "elsewhere"
    assert CompilerSettings().compiler() == "clang++"


def test_the_command_line_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CRESCENT_DATA_DIR", "OPENAI_API_KEY", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    assert CliSettings().up_folder() == Path.home() / ".cache" / "crescent" / "up"
    assert BenchKeySettings().key() is None and TracingSettings().endpoint == ""
    monkeypatch.setenv("CRESCENT_DATA_DIR", "/srv/up")
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    monkeypatch.setenv("MY_BENCH_KEY", "m")
    assert CliSettings().up_folder() == Path("/srv/up") and BenchKeySettings().key() == "k"
    assert TracingSettings().endpoint == "http://collector:4318"
    assert named_variable("MY_BENCH_KEY") == "m" and named_variable("NO_SUCH_VARIABLE_X") is None
