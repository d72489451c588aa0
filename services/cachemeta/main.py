"""Wires cachemeta: settings, database engine, migrations, index load, gRPC server, the sweeper
of silent nodes and the ops port."""

from __future__ import annotations

import contextlib
import gc
import logging
from pathlib import Path

import grpc
from prometheus_client import CollectorRegistry
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from services.cachemeta.catalogue import Catalogue
from services.cachemeta.config import CacheMetaSettings
from services.cachemeta.database import create_engine
from services.cachemeta.keeps import Keeps
from services.cachemeta.metrics import CacheMetaMetrics
from services.cachemeta.migrations import upgrade
from services.cachemeta.repository import DatabaseUnavailable, Repository
from services.cachemeta.servicer import CacheMetaServicer, TokenCheck
from shared.lifecycle import Lifecycle
from shared.ops_http import OpsServer
from shared.rpc import cachemeta_pb2_grpc as pb_grpc
from shared.rpc.client import MAX_MESSAGE_BYTES
from shared.rpc.credentials import add_port
from shared.runtime import run_service
from shared.tls import TlsSettings

log = logging.getLogger("cachemeta")
SERVER_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]


class CacheMetaService:
    """Owns the engine, the catalogue, the gRPC server, the ops server and the lifecycle that
    runs the sweeper and stops them all in reverse order of their start. Invariant: between
    ``start`` and ``stop`` the server answers on ``port`` from a catalogue loaded from the
    database."""

    def __init__(self, settings: CacheMetaSettings) -> None:
        self.settings = settings
        self.engine: AsyncEngine | None = None
        self.catalogue: Catalogue | None = None
        self.keeps: Keeps | None = None
        self.servicer: CacheMetaServicer | None = None
        self.server: grpc.aio.Server | None = None
        self.ops: OpsServer | None = None
        self.port = 0
        self.database_up = False
        self.sweep_errors = 0  # database checks of the sweeper that failed
        self.registry = CollectorRegistry()
        self.lifecycle = Lifecycle("cachemeta", self.registry)
        self._frozen_at = 0  # index size at the last gc.freeze

    async def start(self) -> None:
        s = self.settings
        url = make_url(s.db_url)
        if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
            Path(url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        life = self.lifecycle
        self.engine = create_engine(s.db_url)
        life.on_stop("database engine", self.engine.dispose)
        await upgrade(self.engine)
        self.database_up = True
        catalogue = Catalogue(
            Repository(self.engine),
            replica_grace_s=s.replica_grace_s,
            node_forget_s=s.node_forget_s,
        )
        report = await catalogue.load()
        log.info(
            "index loaded: %d replicas of %d holders, %d nodes in %.2f s",
            report.num_replicas,
            report.num_holders,
            report.num_nodes,
            report.seconds,
        )
        self.catalogue = catalogue
        life.on_stop("catalogue", self._drain_catalogue)
        self.keeps = Keeps(catalogue.repository)
        log.info("keep ledger loaded: %d keeps", await self.keeps.load())
        life.on_stop("keep ledger", self.keeps.drain)
        self._freeze_if_grown()
        self.servicer = CacheMetaServicer(catalogue, self.keeps)
        token = s.cachemeta_token_value()
        if token is None:
            log.warning("no cachemeta token: serving every caller (development mode)")
        checks = [] if token is None else [TokenCheck(token, self.servicer.calls)]
        self.server = grpc.aio.server(options=SERVER_OPTIONS, interceptors=checks)
        pb_grpc.add_CacheMetaServicer_to_server(self.servicer, self.server)
        self.port = add_port(self.server, s.cachemeta_host, s.cachemeta_port, TlsSettings())
        if self.port == 0:
            raise RuntimeError(f"cannot listen on {s.cachemeta_host}:{s.cachemeta_port}")
        await self.server.start()
        life.on_stop("grpc server", self._stop_server)
        if s.metrics_port is not None:
            metrics = CacheMetaMetrics(self)
            self.servicer.on_call = metrics.observe_call
            self.registry.register(metrics)
            self.ops = OpsServer(s.metrics_host, s.metrics_port, self.healthy, self.registry)
            self.ops.start()
            life.on_stop("ops server", self.ops.stop)
        life.every("sweep", s.sweep_every_s, self._sweep, immediately=False)
        await life.start()
        log.info("cachemeta serving gRPC on %s:%d", s.cachemeta_host, self.port)

    def healthy(self) -> bool:
        """Serving: matches are answered from memory even while the database is away."""
        return self.server is not None and self.lifecycle.running

    async def stop(self) -> None:
        """The sweeper, then the steps registered by ``start``, last started first."""
        await self.lifecycle.stop()

    async def _stop_server(self) -> None:
        assert self.server is not None
        await self.server.stop(grace=2.0)

    async def _drain_catalogue(self) -> None:
        assert self.catalogue is not None
        await self.catalogue.drain()
        with contextlib.suppress(Exception):  # best effort: access counts are statistics
            await self.catalogue.flush_touches()

    def _freeze_if_grown(self) -> None:
        """Moves the index's objects out of the garbage collector's sight once it has grown by
        a quarter: millions of long-lived entries (no reference cycles among them) would
        otherwise be rescanned by every full collection, a pause of many milliseconds in the
        middle of prefix matches."""
        assert self.catalogue is not None
        size = self.catalogue.index.num_replicas
        if size > 100_000 and size > 1.25 * self._frozen_at:
            gc.collect()
            gc.freeze()
            self._frozen_at = size

    async def _sweep(self) -> None:
        """Forgets silent nodes and expired keeps; a failure that is not a known outage is
        counted and raised for the lifecycle to log (the schedule goes on)."""
        assert self.catalogue is not None and self.engine is not None
        try:
            async with self.engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
            self.database_up = True
            await self.catalogue.sweep()
            await self.catalogue.flush_touches()
            if self.keeps is not None:
                await self.keeps.purge()
            self._freeze_if_grown()
        except DatabaseUnavailable as exc:
            self.database_up = False
            log.warning("sweep skipped: %s", exc)
        except Exception:
            self.database_up = False
            self.sweep_errors += 1
            raise


def main() -> None:
    settings = CacheMetaSettings()

    async def build() -> CacheMetaService:
        return CacheMetaService(settings)

    run_service("cachemeta", build)
