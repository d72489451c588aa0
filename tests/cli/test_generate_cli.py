"""`crescent generate` as a user runs it: a real process, its stdout, stderr and exit status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared.model.tokenizer import Tokenizer
from shared.sampling_params import SamplingParams
from tests.conftest import RealEngineFactory

pytestmark = pytest.mark.slow


def crescent(cache_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"CRESCENT_CACHE_DIR": str(cache_dir)}
    return subprocess.run(
        [sys.executable, "-m", "crescent", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def write_messages(tmp_path: Path, messages: object) -> Path:
    path = tmp_path / "messages.json"
    path.write_text(json.dumps(messages), encoding="utf-8")
    return path


def test_chat_answer(cache_dir: Path, tmp_path: Path) -> None:
    question = [
        {"role": "user", "content": "What is the capital of France? Answer in one sentence."}
    ]
    done = crescent(cache_dir, "generate", "--messages", str(write_messages(tmp_path, question)))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "The capital of France is Paris."


def test_raw_prompt_equals_the_engine(
    cache_dir: Path, tokenizer: Tokenizer, make_real_engine: RealEngineFactory
) -> None:
    prompt = "def fibonacci(n):\n"
    done = crescent(cache_dir, "generate", "--prompt", prompt, "--max-tokens", "40")
    assert done.returncode == 0, done.stderr
    params = SamplingParams(max_tokens=40, temperature=0.0)
    out = make_real_engine().generate([tokenizer.encode(prompt)], params)[0]
    assert done.stdout == tokenizer.decode(out.output_token_ids)
    assert len(done.stdout) > 20


def test_the_same_seed_gives_the_same_sampled_text(cache_dir: Path) -> None:
    args = ["generate", "--prompt", "Once upon a time", "--max-tokens", "24"]
    sampled = [*args, "--temperature", "1.0", "--top-p", "0.95"]
    first = crescent(cache_dir, *sampled, "--seed", "11")
    again = crescent(cache_dir, *sampled, "--seed", "11")
    other = crescent(cache_dir, *sampled, "--seed", "12")
    assert first.returncode == again.returncode == other.returncode == 0
    assert first.stdout == again.stdout != other.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--prompt", "hi", "--model", "/no/such/model.gguf"], "does not exist"),
        (["--prompt", "hi", "--temperature", "3"], "temperature"),
        (["--prompt", "hi", "--max-tokens", "0"], "max_tokens"),
        (["--prompt", "hi", "--top-p", "abc"], "invalid float"),
        (["--prompt", "hi", "--messages", "m.json"], "not allowed with"),
        (["--messages", "/no/such/file.json"], "does not exist"),
        (["--prompt", "word " * 9000], "maximum context length is 8192"),
    ],
)
def test_bad_input_is_one_line_of_error_on_stderr_and_exit_2(
    cache_dir: Path, args: list[str], needle: str
) -> None:
    """One line of error; a bad argument has the command's usage above it, nothing else does."""
    done = crescent(cache_dir, "generate", *args)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert needle in lines[-1] and "error:" in lines[-1], done.stderr
    above = lines[:-1]
    assert not above or above[0].startswith("usage: crescent generate"), done.stderr
    assert not any("error:" in line for line in above), done.stderr


@pytest.mark.parametrize("content", ["not json", json.dumps({"role": "user"}), json.dumps([])])
def test_bad_messages_file(cache_dir: Path, tmp_path: Path, content: str) -> None:
    path = tmp_path / "messages.json"
    path.write_text(content, encoding="utf-8")
    done = crescent(cache_dir, "generate", "--messages", str(path))
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_the_model_can_come_from_the_environment(cache_dir: Path) -> None:
    env = os.environ | {"CRESCENT_CACHE_DIR": str(cache_dir), "CRESCENT_MODEL": "/no/such.gguf"}
    done = subprocess.run(
        [sys.executable, "-m", "crescent", "generate", "--prompt", "hi"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 2 and "/no/such.gguf does not exist" in done.stderr
