"""cachemeta's Prometheus view: the index's size, the database's health and errors, and the
gRPC calls answered, with a latency histogram per method."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.cachemeta.catalogue import Catalogue
from services.cachemeta.servicer import CacheMetaServicer

#: A prefix match answers from memory in well under a millisecond; a write waits on the
#: database.
_CALL_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2)


class Observed(Protocol):
    """What the metrics read of the running service."""

    catalogue: Catalogue | None
    servicer: CacheMetaServicer | None
    database_up: bool
    sweep_errors: int


class CacheMetaMetrics(Collector):
    """Reads the catalogue and the servicer at scrape time; owns the call latency histogram,
    which the servicer feeds through its ``on_call`` hook."""

    def __init__(self, service: Observed) -> None:
        self.service = service
        self.latency = Histogram(
            "crescent_cachemeta_call_duration_seconds",
            "time to answer one gRPC call, by method",
            ["method"],
            buckets=_CALL_BUCKETS,
            registry=None,
        )

    def observe_call(self, method: str, seconds: float) -> None:
        self.latency.labels(method).observe(seconds)

    def collect(self) -> Iterator[Metric]:
        catalogue, servicer = self.service.catalogue, self.service.servicer
        if catalogue is None or servicer is None:
            return
        gauges = (
            (
                "crescent_cachemeta_blocks",
                "distinct blocks held by some node",
                len(catalogue.index),
            ),
            ("crescent_cachemeta_replicas", "replicas in the index", catalogue.index.num_replicas),
            ("crescent_cachemeta_nodes", "nodes known", len(catalogue.nodes)),
            (
                "crescent_cachemeta_kept_blocks",
                "blocks kept for their tenants (cache_control.keep) now",
                servicer.keeps.num_in_force(),
            ),
            (
                "crescent_cachemeta_database_up",
                "last database check passed",
                self.service.database_up,
            ),
        )
        for name, doc, value in gauges:
            yield GaugeMetricFamily(name, doc, value=float(value))
        errors = catalogue.repository.errors + self.service.sweep_errors
        yield CounterMetricFamily(
            "crescent_cachemeta_database_errors",
            "statements and health checks that failed on the database",
            value=errors,
        )
        calls = CounterMetricFamily(
            "crescent_cachemeta_calls", "gRPC calls answered", labels=["method", "code"]
        )
        for (method, code), count in sorted(servicer.calls.items()):
            calls.add_metric([method, code], count)
        seconds = CounterMetricFamily(
            "crescent_cachemeta_call_seconds", "time spent answering", labels=["method"]
        )
        for method, total in sorted(servicer.seconds.items()):
            seconds.add_metric([method], total)
        yield from (calls, seconds)
        yield from self.latency.collect()
