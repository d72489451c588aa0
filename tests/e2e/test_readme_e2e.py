"""README.md's quick start, as written, against the session's `crescent up`: its curl command
answers at once and ends by itself, and its Python example streams.

Only the host and port change. The stack a reader starts is open, the session's has API keys:
the key goes in beside the text (curl's own config file, the client's ``api_key``), never into
it. (On a stack just started, the curl's first answer took 0.36 s on the two-core VM.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.conftest import REPO_ROOT
from tests.e2e.conftest import ALICE_KEY
from tests.e2e.stack import Stack

pytestmark = pytest.mark.slow

README_HOST = "127.0.0.1:8000"
CURL = f"curl http://{README_HOST}/v1/chat/completions"
#: What a first answer of the default model may take on a busy two-core machine.
QUICK_S = 5.0


def fenced_blocks(language: str) -> list[str]:
    """The bodies of README.md's fenced blocks in ``language``."""
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(rf"^```{language}\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)


def quick_start(language: str, marker: str) -> str:
    found = [block for block in fenced_blocks(language) if marker in block]
    assert found, f"README.md has no ```{language} block with {marker!r}"
    return found[0]


def on_stack(code: str, stack: Stack) -> str:
    assert README_HOST in code
    return code.replace(README_HOST, f"127.0.0.1:{stack.port}")


def test_the_readme_curl_answers_quickly_and_stops(stack: Stack, tmp_path: Path) -> None:
    command = on_stack(quick_start("bash", CURL), stack)
    # curl reads $CURL_HOME/.curlrc before its arguments: the stack's key, outside the text.
    (tmp_path / ".curlrc").write_text(f'header = "Authorization: Bearer {ALICE_KEY}"\n')
    env = os.environ | {"CURL_HOME": str(tmp_path)}
    started = time.monotonic()
    done = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "stop", answer
    assert choice["message"]["content"].strip(), answer
    assert took < QUICK_S, f"the README's curl took {took:.1f} s: {answer}"


def test_the_readme_python_example_streams(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    code = on_stack(quick_start("python", "from openai import OpenAI"), stack)

    class KeyedOpenAI(openai.OpenAI):
        """The example's client with the stack's key in place of its placeholder."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **(kwargs | {"api_key": ALICE_KEY, "max_retries": 0}))

    monkeypatch.setattr(openai, "OpenAI", KeyedOpenAI)
    printed: list[str] = []

    def record(*values: Any, **_: Any) -> None:
        printed.append("".join(str(v) for v in values))

    namespace: dict[str, Any] = {"print": record}
    started = time.monotonic()
    exec(compile(code, "README.md", "exec"), namespace)  # the README's own example
    took = time.monotonic() - started
    pieces = [p for p in printed if p]
    assert len(pieces) > 1, printed
    assert "".join(pieces).strip()
    assert namespace["chunk"].choices[0].finish_reason == "stop", "".join(pieces)
    assert took < 60, f"the README's Python example took {took:.1f} s"
