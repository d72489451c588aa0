"""`crescent hash-key` as an operator runs it: the key on stdin, the key file's line on stdout."""

from __future__ import annotations

import subprocess
import sys

from services.gateway.auth import ApiKeys, parse_key_file

KEY = "sk-prod-0b7e51c2d9a4"


def hash_key(stdin: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "crescent", "hash-key", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_it_prints_a_line_the_gateway_accepts_and_never_the_key() -> None:
    done = hash_key(f"{KEY}\n", "alpha")
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert line.startswith("sha256:") and line.endswith(" alpha")
    assert KEY not in done.stdout and KEY not in done.stderr
    keys = ApiKeys(parse_key_file(done.stdout))
    assert keys.tenant(f"Bearer {KEY}") == "alpha"


def test_no_key_or_a_bad_tenant_is_an_error() -> None:
    empty = hash_key("\n", "alpha")
    assert empty.returncode == 2 and "no key on stdin" in empty.stderr
    spaced = hash_key(f"{KEY}\n", "two words")
    assert spaced.returncode == 2 and "one word" in spaced.stderr
    assert KEY not in spaced.stdout + spaced.stderr
    missing = hash_key(f"{KEY}\n")
    assert missing.returncode == 2 and KEY not in missing.stdout + missing.stderr
