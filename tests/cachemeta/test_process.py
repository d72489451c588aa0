"""``python -m services.cachemeta`` as operators run it: env, ops port, SIGTERM, restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from shared.rpc.client import CacheMetaClient
from shared.rpc.types import PrefixHolder
from tests.cachemeta.chains import chain, hashes
from tests.support.loop import BackgroundLoop
from tests.support.nats import free_port
from tests.support.wait import wait_until

ROOT = Path(__file__).resolve().parents[2]


def start(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "services.cachemeta"],
            cwd=ROOT,
            env=os.environ | env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return reply.status, reply.read().decode()
    except OSError as exc:
        return -1, str(exc)


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    def healthy() -> bool:
        assert proc.poll() is None, f"cachemeta exited:\n{log.read_text()}"
        return get(f"{url}/healthz")[0] == 200

    wait_until(healthy, f"cachemeta to become healthy (its log: {log})", 30)


def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


def test_process_serves_restarts_and_stops_on_sigterm(
    bg_loop: BackgroundLoop, tmp_path: Path
) -> None:
    grpc_port, ops_port = free_port(), free_port()
    env = {
        "CRESCENT_DB_URL": f"sqlite+aiosqlite:///{tmp_path / 'state' / 'cachemeta.db'}",
        "CRESCENT_CACHEMETA_PORT": str(grpc_port),
        "CRESCENT_METRICS_PORT": str(ops_port),
    }
    log = tmp_path / "cachemeta.log"
    ops = f"http://127.0.0.1:{ops_port}"
    client = CacheMetaClient(f"127.0.0.1:{grpc_port}", timeout_s=5)
    blocks = chain(list(range(24)))

    proc = start(env, log)
    try:
        wait_healthy(ops, proc, log)
        assert bg_loop.run(client.register_blocks("n1", "nvme", blocks)) == 6
        status, metrics = get(f"{ops}/metrics")
        assert status == 200
        assert "crescent_cachemeta_replicas 6.0" in metrics
        assert 'crescent_cachemeta_calls_total{code="OK",method="RegisterBlocks"} 1.0' in metrics
        latency = 'crescent_cachemeta_call_duration_seconds_count{method="RegisterBlocks"} 1.0'
        assert latency in metrics
        assert "crescent_cachemeta_database_errors_total 0.0" in metrics
        assert stop(proc) == 0
        assert "cachemeta stopping" in log.read_text()

        proc = start(env, log)
        wait_healthy(ops, proc, log)
        found = bg_loop.run(client.match_prefix(hashes(blocks)))
        assert found == [PrefixHolder("n1", "nvme", 6)]
        assert "index loaded: 6 replicas of 1 holders" in log.read_text()
        assert stop(proc) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        bg_loop.run(client.close())
