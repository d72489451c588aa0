"""A service given a placeholder secret does not start: real service processes, each with one
of the values earlier compose and Kubernetes files shipped, exit non-zero at once with an
error that says so and does not repeat the value."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def run_service(module: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CRESCENT_")}
    return subprocess.run(
        [sys.executable, "-m", module],
        env=base | {"CRESCENT_DEV_MODE": "false"} | env,
        cwd=cwd,
        capture_output=True,
        text=True,
        # A service that accepted the value would serve until killed: that is a failure too.
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("token", ["change-me-cachemeta-token", "replace-me-cachemeta-token"])
def test_cachemeta_refuses_a_placeholder_token(tmp_path: Path, token: str) -> None:
    env = {
        "CRESCENT_CACHEMETA_TOKEN": token,
        "CRESCENT_DB_URL": f"sqlite+aiosqlite:///{tmp_path / 'cachemeta.db'}",
        "CRESCENT_CACHEMETA_PORT": "0",
    }
    done = run_service("services.cachemeta", env, tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "the cachemeta token is a known placeholder or default value" in output
    assert token not in output


def test_the_scheduler_refuses_a_placeholder_cache_secret(tmp_path: Path) -> None:
    secret = "change-me-in-production"
    done = run_service("services.scheduler", {"CRESCENT_CACHE_SECRET": secret}, tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "CRESCENT_CACHE_SECRET is a known placeholder or default value" in output
    assert secret not in output


def test_a_node_refuses_a_placeholder_cachemeta_token_from_its_file(tmp_path: Path) -> None:
    token = tmp_path / "cachemeta-token"
    token.write_text("trial-cachemeta-token-value\n")
    env = {
        "CRESCENT_CACHE_SECRET": "a-chosen-cache-secret-5d1e9b",
        "CRESCENT_CACHEMETA_TOKEN_FILE": str(token),
    }
    done = run_service("services.tierd", env, tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "the cachemeta token is a known placeholder or default value" in output
    assert "trial-cachemeta-token-value" not in output
