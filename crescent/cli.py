"""The ``crescent`` command line: one sub-command per verb, each importing only what it needs."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import tomllib
from collections.abc import Iterable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, NoReturn

from crescent import config_reference, generate, secrets_cli, serve, status, up
from crescent.bench import options as bench_options
from crescent.plan import cli as plan_cli
from crescent.sim import cli as sim_cli

_UNRECOGNIZED = "unrecognized arguments: "


class _OneLineParser(argparse.ArgumentParser):
    """Owns one command's flags: only their exact names (no prefix of a flag stands for it),
    and a bad argument reported as the command's usage, one line of error and, for a
    misspelt flag or command, the closest real one; exit status 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, args: Iterable[str] | None = None, namespace: Any = None) -> Any:
        # argparse reports a sub-command's unknown flags from the top parser; report them
        # from the sub-command's, whose usage and flags are the ones that help.
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self._chosen(parsed).error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        close = self._closest(message)
        if close:
            sys.stderr.write(f"{self.prog}: did you mean {close}?\n")
        raise SystemExit(2)

    def _chosen(self, parsed: argparse.Namespace) -> _OneLineParser:
        """The innermost sub-command's parser that ``parsed`` went through."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                sub = action.choices.get(str(getattr(parsed, action.dest, "")))
                if isinstance(sub, _OneLineParser):
                    return sub._chosen(parsed)
        return self

    def _closest(self, message: str) -> str | None:
        if message.startswith(_UNRECOGNIZED):
            flags = [flag for action in self._actions for flag in action.option_strings]
            for word in message.removeprefix(_UNRECOGNIZED).split():
                if word.startswith("-"):
                    close = difflib.get_close_matches(word.split("=", 1)[0], flags, n=1)
                    if close:
                        return close[0]
            return None
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice is None:
            return None
        names = [name.strip(" '") for name in choice.group(2).split(",")]
        close = difflib.get_close_matches(choice.group(1), names, n=1)
        return close[0] if close else None


def version() -> str:
    """The installed distribution's version; the source tree's where none is installed."""
    try:
        return metadata.version("crescent")
    except metadata.PackageNotFoundError:
        with (Path(__file__).resolve().parents[1] / "pyproject.toml").open("rb") as f:
            return str(tomllib.load(f)["project"]["version"])


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="crescent", description="Crescent: KV-cache-centric LLM serving")
    parser.add_argument("--version", action="version", version=f"crescent {version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_OneLineParser)
    generate.add_arguments(sub.add_parser("generate", help="generate text with the local engine"))
    up.add_arguments(sub.add_parser("up", help="run the whole stack on this machine"))
    bench_options.add_arguments(
        sub.add_parser(
            "bench",
            help="measure an OpenAI-compatible server on a workload",
            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        )
    )
    sim_cli.add_arguments(
        sub.add_parser(
            "sim",
            help="simulate a cluster replaying a trace, placed by the live scheduler",
            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        )
    )
    plan_cli.add_arguments(
        sub.add_parser(
            "plan",
            help="the fewest prefill and decode nodes that meet TTFT and TPOT objectives",
            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        )
    )
    serve.add_arguments(
        sub.add_parser("serve", help="run one service of a deployment over several hosts")
    )
    hash_key = sub.add_parser(
        "hash-key", help="print the CRESCENT_API_KEYS_FILE line of the API key read on stdin"
    )
    hash_key.add_argument("tenant", help="the tenant the key belongs to")
    status.add_arguments(
        sub.add_parser("status", help="the cluster as a running gateway sees it (rich tables)")
    )
    secrets_cli.add_arguments(
        sub.add_parser("secrets", help="generate a compose or Kubernetes deployment's secrets")
    )
    config_reference.add_arguments(
        sub.add_parser("config-reference", help="print the table of every CRESCENT_* variable")
    )
    return parser


def _hash_key(tenant: str) -> int:
    """Reads one key from stdin (not an argument: those show up in ``ps`` and shell history)."""
    from services.gateway.auth import key_line

    key = sys.stdin.readline().strip()
    if not key:
        sys.stderr.write("crescent hash-key: error: no key on stdin\n")
        return 2
    try:
        print(key_line(key, tenant))
    except ValueError as exc:
        sys.stderr.write(f"crescent hash-key: error: {exc}\n")
        return 2
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "generate":
        return generate.run(args)
    if args.command == "up":
        return up.run(args)
    if args.command == "bench":
        from crescent.bench.main import run as run_bench  # httpx, numpy, matplotlib: on use

        return run_bench(args)
    if args.command == "sim":
        return sim_cli.run(args)
    if args.command == "plan":
        return plan_cli.run(args)
    if args.command == "hash-key":
        return _hash_key(args.tenant)
    if args.command == "status":
        return status.run(args)
    if args.command == "secrets":
        return secrets_cli.run(args)
    if args.command == "config-reference":
        return config_reference.run(args)
    if args.command == "serve":
        return serve.run(args)
    return 2
