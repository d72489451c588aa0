"""What a started `crescent up` tells: where its parts listen (``stack.json`` in the data dir,
for tools that watch or probe it) and, on stdout, where to send requests."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from crescent import up_tierd
from shared.tls import TlsSettings
from shared.tls import summary as tls_summary


def api_base(host: str, port: int) -> str:
    """The gateway's base URL (``/v1`` is the OpenAI API under it)."""
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}"


def describe(
    data_dir: Path,
    api: str,
    env: dict[str, str],
    tierd_env: dict[str, str],
    metrics: dict[str, int],
    kvindex: dict[str, str],
) -> None:
    """Writes where the stack's parts listen to ``stack.json`` in the data dir (the NATS
    password of the ``tools`` user is in ``secrets/nats-tools.password`` when this stack runs
    its own NATS). ``metrics`` maps each child to the port of its ``/metrics``; the gateway's
    is on the API's port (``api``). ``kvindex``: where the KV index answers and serves its own
    ``/metrics`` (``crescent.up_kvindex``)."""
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
    } | kvindex
    (data_dir / "stack.json").write_text(json.dumps(where, indent=2) + "\n")


def announce(api: str, data_dir: Path, model_name: str, kvindex: str) -> None:
    """The lines that say the stack serves, with a request to try; ``kvindex`` says where the
    KV index answers (``crescent.up_kvindex.summary``)."""
    print(f"Crescent is serving the OpenAI API at {api}/v1")
    print(f"  logs: {data_dir / 'logs'}")
    print(f"  KV index: {kvindex}")
    print(f"  links: {tls_summary(TlsSettings())}")
    hi = [{"role": "user", "content": "Hi!"}]
    body = json.dumps({"model": model_name, "messages": hi, "temperature": 0, "max_tokens": 64})
    print(f"  try:  curl {api}/v1/chat/completions -H 'Content-Type: application/json' -d '{body}'")
    sys.stdout.flush()
