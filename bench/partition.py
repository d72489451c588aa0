"""A decode node cut off by the network, not killed: it sits in a network namespace of its own,
joined to the host by a veth pair, and the link is cut while it serves streams.

Nothing tells anyone it is gone (no closed connection, no disconnect event): its heartbeats
just stop. The gateways move its requests after the heartbeat timeout; when the link comes
back, the node reconnects and finds out from the gateways that nobody wants what it still
runs, and stops it. Needs root (``ip netns``, veth); NATS listens on the host end of the link.

    .venv/bin/python bench/partition.py
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import netns
from bench.chaos import Harness, Live, open_harness, stories
from bench.faults import Stack, Tally
from crescent.certs import LOOPBACK_IPS, write_cert
from crescent.nats_tls import tls_section
from crescent.processes import spawn
from crescent.procfs import environ_of
from shared.tls import TlsSettings

__all__ = ["Tally", "namespace", "open_partitioned", "partition", "start", "stop", "supported"]
from tests.support.nats import free_port, nats_server_binary

NS, HOST_IF, NODE_IF = "crescent-part", "cr-part-h", "cr-part-n"
HOST_IP, NODE_IP = "10.77.0.1", "10.77.0.2"
NODE = "decode-ns"
#: How long the link stays cut: past the heartbeat timeout, short of the streams' end.
CUT_S = 5.0


@contextlib.contextmanager
def namespace() -> Iterator[None]:
    """A network namespace joined to the host by a veth pair (host end ``HOST_IP``)."""
    with netns.namespace(NS):
        netns.veth(HOST_IF, NS, NODE_IF, f"{NODE_IP}/24", outer=f"{HOST_IP}/24")
        try:
            yield
        finally:
            netns.remove_link(HOST_IF)


def cut(up: bool) -> None:
    netns.set_link(HOST_IF, up)


def supported() -> str | None:
    """Why this cannot run here, or None."""
    return netns.supported("crescent-probe")


@dataclass
class Partitioned:
    """The stack, the node in the namespace, and the NATS server on the link's host end."""

    stack: Stack
    node: subprocess.Popen[bytes]
    nats: subprocess.Popen[bytes]
    tls: TlsSettings


def start(data_dir: Path, cache_dir: Path) -> Partitioned:
    """The stack on the host's end of the link, over TLS (its links leave loopback): one
    certificate of a CA of its own names every address the services dial."""
    certs = write_cert(data_dir / "tls", "partition", ips=(*LOOPBACK_IPS, HOST_IP, NODE_IP))
    tls = TlsSettings(
        tls="on", tls_ca_file=certs.ca, tls_cert_file=certs.cert, tls_key_file=certs.key
    )
    config = data_dir / "nats.conf"
    config.write_text(f"tls: {json.dumps(tls_section(tls)['tls'])}\n")
    port = free_port()
    nats = subprocess.Popen(
        [str(nats_server_binary()), "-c", str(config), "-a", HOST_IP, "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    env = certs.env() | {
        "CRESCENT_CACHE_DIR": str(cache_dir),
        "CRESCENT_NATS_URL": f"nats://{HOST_IP}:{port}",
        "CRESCENT_TRANSFER": "tcp",
        "CRESCENT_TRANSFER_HOST": HOST_IP,
        "CRESCENT_KV_CACHE_MB": "256",
        "CRESCENT_HEARTBEAT_INTERVAL_S": "0.5",
    }
    try:
        stack = Stack.start(data_dir / "stack", env, ("--prefill", "1", "--decode", "1"))
    except BaseException:
        nats.kill()  # nothing else would stop it
        nats.wait()
        raise
    beside = stack.children()["decode-0"]
    node_env = environ_of(beside) | {
        "CRESCENT_NODE_ID": NODE,
        "CRESCENT_CHILD_NAME": NODE,
        "CRESCENT_TRANSFER_HOST": NODE_IP,
        "CRESCENT_CACHEMETA_URL": "",  # cachemeta listens on the host's loopback only
    }
    # Started as `crescent up` started the node beside it: its own scheduling group, at the
    # same priority. Above it, the cut-off node (still decoding, unheard) would take the CPU
    # from the node that has to finish its streams, on a host with a core to spare or not.
    argv = netns.inside(NS, [sys.executable, "-m", "services.decode"])
    nice = os.getpriority(os.PRIO_PROCESS, beside)
    node = spawn(NODE, argv, node_env, data_dir, nice=nice).proc
    return Partitioned(stack, node, nats, tls)


async def partition(h: Harness) -> tuple[Tally, float]:
    """Cuts the link while the namespaced node serves streams, for ``CUT_S``; returns the
    streams' tally and the seconds, after the link is back, until the node has stopped the
    copies it still ran (their streams had long moved elsewhere)."""
    await h.beats.fresh([NODE], 0.0)
    ps, max_tokens = stories(6), 320
    live = Live(h, ps, max_tokens)
    deadline = time.monotonic() + 30
    while _running(h, NODE) == 0:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no stream went to {NODE}")
        await asyncio.sleep(0.05)
    cut(up=False)
    await asyncio.sleep(CUT_S)
    cut(up=True)
    restored = time.monotonic()
    await h.beats.fresh([NODE], restored)
    while _running(h, NODE):
        if time.monotonic() - restored > 60:
            raise TimeoutError(f"{NODE} still runs requests nobody wants")
        await asyncio.sleep(0.1)
    stopped = time.monotonic() - restored
    outcomes = await live.done()
    tally = await h.compare("decode node partitioned", ps, outcomes, max_tokens)
    return tally, stopped


def _running(h: Harness, node_id: str) -> int:
    seen = h.beats.latest.get(node_id)
    return seen[1].running_seqs if seen else 0


async def open_partitioned(p: Partitioned) -> Harness:
    nodes = ("prefill-0", "decode-0", NODE)
    return await open_harness(p.stack, nodes, nats_auth={}, tls=p.tls)


def stop(p: Partitioned) -> None:
    p.node.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.node.wait(timeout=30)
    if p.node.poll() is None:
        p.node.kill()
    p.stack.stop()
    p.nats.terminate()
    p.nats.wait(timeout=10)


async def main_async(cache_dir: Path) -> int:
    with tempfile.TemporaryDirectory(prefix="crescent-partition-") as tmp, namespace():
        part = start(Path(tmp), cache_dir)
        try:
            harness = await open_partitioned(part)
            tally, stopped = await partition(harness)
            await harness.beats.close()
            await harness.client.close()
        finally:
            stop(part)
    print(json.dumps({"tally": tally.__dict__, "stale_stopped_after_s": round(stopped, 2)}))
    return 0 if tally.clean else 1


def main() -> None:
    why = supported()
    if why is not None:
        sys.exit(f"bench/partition.py: {why}")
    cache_dir = Path(os.environ.get("CRESCENT_CACHE_DIR", Path.home() / ".cache" / "crescent"))
    sys.exit(asyncio.run(main_async(cache_dir)))


if __name__ == "__main__":
    main()
