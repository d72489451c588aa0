"""The ``crescent`` command line: one sub-command per verb, each importing only what it needs."""

from __future__ import annotations

import argparse
import runpy
import sys
from collections.abc import Sequence

from crescent import config_reference, generate, status, up
from crescent.bench import options as bench_options
from crescent.sim import cli as sim_cli

SERVICES = ("gateway", "scheduler", "prefill", "decode", "tierd")


class _OneLineParser(argparse.ArgumentParser):
    """Reports a bad argument as a single line on stderr with exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="crescent", description="Crescent: KV-cache-centric LLM serving")
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
    serve = sub.add_parser("serve", help="run one service in this process")
    serve.add_argument("service", choices=SERVICES)
    hash_key = sub.add_parser(
        "hash-key", help="print the CRESCENT_API_KEYS_FILE line of the API key read on stdin"
    )
    hash_key.add_argument("tenant", help="the tenant the key belongs to")
    status.add_arguments(
        sub.add_parser("status", help="the cluster as a running gateway sees it (rich tables)")
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
    if args.command == "hash-key":
        return _hash_key(args.tenant)
    if args.command == "status":
        return status.run(args)
    if args.command == "config-reference":
        return config_reference.run(args)
    if args.command == "serve":
        # The same entry point as `python -m services.<name>`; settings come from CRESCENT_*.
        runpy.run_module(f"services.{args.service}", run_name="__main__", alter_sys=True)
        return 0
    return 2
