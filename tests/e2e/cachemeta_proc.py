"""cachemeta as a process the tests own: started, killed and restarted on one database."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from shared.rpc.client import CacheMetaClient, CacheMetaUnavailable
from shared.rpc.types import CatalogueStats
from tests.support.loop import shared_loop
from tests.support.nats import free_port, wait_for_port


@dataclass
class CacheMetaProcess:
    db_url: str
    log_dir: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @classmethod
    def start(cls, db_url: str, log_dir: Path) -> CacheMetaProcess:
        cm = cls(db_url, log_dir)
        cm.restart()
        return cm

    def restart(self) -> None:
        env = os.environ | {
            "CRESCENT_DB_URL": self.db_url,
            "CRESCENT_CACHEMETA_HOST": "127.0.0.1",
            "CRESCENT_CACHEMETA_PORT": str(self.port),
        }
        log = (self.log_dir / "cachemeta.log").open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "services.cachemeta"], env=env, stdout=log, stderr=log
        )
        wait_for_port(self.port, 60, self.proc, "cachemeta")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


def catalogue_stats(target: str) -> CatalogueStats | None:
    async def fetch() -> CatalogueStats | None:
        client = CacheMetaClient(target, timeout_s=2)
        try:
            return await client.stats()
        except CacheMetaUnavailable:
            return None
        finally:
            await client.close()

    return shared_loop().run(fetch())
