"""A gateway without API keys does not start unless told to serve anyone, and says so loudly
when it does."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from services.gateway.config import GatewaySettings
from tests.gateway.conftest import gateway_settings
from tests.support.fake_engine import FakeEngine
from tests.support.gateway import ServedGateway
from tests.support.loop import BackgroundLoop

REPO = Path(__file__).resolve().parents[2]


def test_settings_without_keys_are_refused_outside_development(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CRESCENT_DEV_MODE", "false")
    monkeypatch.delenv("CRESCENT_API_KEYS", raising=False)
    monkeypatch.delenv("CRESCENT_ALLOW_UNAUTHENTICATED", raising=False)
    with pytest.raises(ValidationError, match="no API keys"):
        GatewaySettings()
    assert GatewaySettings(allow_unauthenticated=True).runs_open_on_purpose
    assert GatewaySettings.model_validate({"api_keys": "sk-one:alpha"}).tenants_by_digest
    monkeypatch.setenv("CRESCENT_DEV_MODE", "true")
    assert GatewaySettings().runs_open_on_purpose


def test_the_gateway_process_refuses_to_start_open(tmp_path: Path) -> None:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("CRESCENT_") or key == "CRESCENT_CACHE_DIR"
    }
    # Nothing listens there: a gateway that got as far as the bus would wait, not exit.
    env |= {"CRESCENT_DEV_MODE": "false", "CRESCENT_NATS_URL": "nats://127.0.0.1:9"}
    done = subprocess.run(
        [sys.executable, "-m", "services.gateway"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0
    assert "no API keys" in done.stderr
    assert "CRESCENT_ALLOW_UNAUTHENTICATED" in done.stderr


def test_an_open_gateway_warns(
    bg_loop: BackgroundLoop,
    nats_url: str,
    cache_dir: Path,
    fake_engine: FakeEngine,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = gateway_settings(nats_url, cache_dir, allow_unauthenticated=True, dev_mode=False)
    served = ServedGateway(bg_loop, settings)
    with caplog.at_level(logging.WARNING, logger="services.gateway"):
        served.start()
    served.stop()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("no API keys" in w and "ALLOW_UNAUTHENTICATED" in w for w in warnings)
