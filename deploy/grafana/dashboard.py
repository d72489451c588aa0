"""Writes deploy/grafana/dashboards/crescent.json, the Grafana dashboard of a Crescent
deployment: one row per service (kvindex's too), one for the cache, one for the alerts of
deploy/alerts.yml. Run it after changing a panel: `python deploy/grafana/dashboard.py`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
DATASOURCE = {"type": "prometheus", "uid": "crescent-prometheus"}


def p95(metric: str, by: str = "") -> str:
    group = f"le, {by}" if by else "le"
    return f"histogram_quantile(0.95, sum by ({group}) (rate({metric}_bucket[5m])))"


def timeseries(title: str, unit: str, *targets: tuple[str, str]) -> dict[str, Any]:
    return {
        "type": "timeseries",
        "title": title,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [
            {"refId": chr(65 + i), "expr": expr, "legendFormat": legend, "datasource": DATASOURCE}
            for i, (expr, legend) in enumerate(targets)
        ],
    }


def stat(title: str, expr: str, unit: str = "none") -> dict[str, Any]:
    panel = timeseries(title, unit, (expr, ""))
    panel["type"] = "stat"
    return panel


ROWS: list[tuple[str, list[dict[str, Any]]]] = [
    (
        "Gateway",
        [
            timeseries(
                "Requests by endpoint and status",
                "reqps",
                (
                    "sum by (endpoint, status) (rate(crescent_gateway_requests_total[1m]))",
                    "{{endpoint}} {{status}}",
                ),
            ),
            timeseries(
                "Time to first token",
                "s",
                (p95("crescent_gateway_time_to_first_token_seconds"), "p95"),
                (
                    "histogram_quantile(0.5, sum by (le) (rate("
                    "crescent_gateway_time_to_first_token_seconds_bucket[5m])))",
                    "p50",
                ),
            ),
            timeseries(
                "Time per output token and end to end",
                "s",
                (p95("crescent_gateway_time_per_output_token_seconds"), "TPOT p95"),
                (p95("crescent_gateway_e2e_request_latency_seconds"), "e2e p95"),
            ),
            timeseries(
                "Requests in flight and migrations",
                "none",
                ("sum(crescent_gateway_requests_in_flight)", "in flight"),
                ("sum(rate(crescent_gateway_request_migrations_total[5m]))", "migrations/s"),
            ),
            timeseries(
                "Where a request's time goes (p95 per phase)",
                "s",
                (p95("crescent_gateway_request_phase_seconds", "phase"), "{{phase}}"),
            ),
        ],
    ),
    (
        "Scheduler",
        [
            timeseries(
                "Placements, rejections by cause, re-placements",
                "reqps",
                ("sum(rate(crescent_placements_total[1m]))", "placed"),
                ("sum by (cause) (rate(crescent_rejections_total[1m]))", "refused {{cause}}"),
                ("sum by (cause) (rate(crescent_replacements_total[1m]))", "re-placed {{cause}}"),
            ),
            timeseries(
                "Queue and live nodes",
                "none",
                ("sum(crescent_scheduler_pending_requests)", "pending"),
                ("max by (role) (crescent_live_nodes)", "live {{role}}"),
            ),
            timeseries(
                "Predicted time to first token",
                "s",
                (p95("crescent_predicted_ttft_seconds"), "p95"),
            ),
            timeseries(
                "cachemeta fallbacks",
                "reqps",
                ("sum by (reason) (rate(crescent_cachemeta_fallbacks_total[1m]))", "{{reason}}"),
            ),
        ],
    ),
    (
        "Prefill and decode nodes",
        [
            timeseries(
                "Running and waiting sequences",
                "none",
                ("crescent_running_sequences", "{{node}} running"),
                ("crescent_waiting_sequences", "{{node}} waiting"),
            ),
            timeseries(
                "Queued prompt tokens", "none", ("crescent_queued_prompt_tokens", "{{node}}")
            ),
            timeseries(
                "KV pool in use",
                "percentunit",
                ("1 - crescent_kv_free_blocks / crescent_kv_total_blocks", "{{node}}"),
            ),
            timeseries(
                "KV transfer bytes by transport and source",
                "Bps",
                (
                    "sum by (transport, source) (rate(crescent_kv_transfer_bytes_total[1m]))",
                    "{{transport}} {{source}}",
                ),
            ),
            timeseries(
                "KV transfer duration (p95)",
                "s",
                (p95("crescent_kv_transfer_duration_seconds", "source"), "{{source}}"),
            ),
            timeseries(
                "Checksum failures and failed pulls",
                "none",
                (
                    "sum by (source) (increase(crescent_kv_checksum_failures_total[5m]))",
                    "corrupt {{source}}",
                ),
                (
                    "sum by (source) (increase(crescent_kv_transfer_failures_total[5m]))",
                    "failed {{source}}",
                ),
            ),
            timeseries(
                "Requests ended by outcome",
                "reqps",
                (
                    "sum by (role, outcome) (rate(crescent_node_requests_finished_total[1m]))",
                    "{{role}} {{outcome}}",
                ),
            ),
        ],
    ),
    (
        "cachemeta",
        [
            timeseries(
                "Call latency (p99) by method",
                "s",
                (
                    "histogram_quantile(0.99, sum by (le, method) (rate("
                    "crescent_cachemeta_call_duration_seconds_bucket[5m])))",
                    "{{method}}",
                ),
            ),
            timeseries(
                "Index size",
                "none",
                ("crescent_cachemeta_blocks", "blocks"),
                ("crescent_cachemeta_replicas", "replicas"),
            ),
            timeseries(
                "Database errors and health",
                "none",
                ("rate(crescent_cachemeta_database_errors_total[5m])", "errors/s"),
                ("crescent_cachemeta_database_up", "up"),
            ),
        ],
    ),
    (
        "tierd",
        [
            timeseries(
                "Bytes per tier against capacity",
                "bytes",
                ("crescent_tierd_used_bytes", "{{node}} {{tier}} used"),
                ("crescent_tierd_capacity_bytes", "{{node}} {{tier}} capacity"),
            ),
            timeseries(
                "Evictions by policy, tier and reason",
                "none",
                (
                    "sum by (policy, tier, reason) "
                    "(increase(crescent_tierd_evicted_blocks_total[5m]))",
                    "{{policy}} {{tier}} {{reason}}",
                ),
                (
                    "sum by (policy) (increase(crescent_kv_pool_evicted_blocks_total[5m]))",
                    "pool {{policy}}",
                ),
            ),
            timeseries(
                "Blocks written, read and found corrupt",
                "none",
                (
                    "sum by (tier) (rate(crescent_tierd_written_blocks_total[1m]))",
                    "written {{tier}}",
                ),
                ("sum by (tier) (rate(crescent_tierd_read_blocks_total[1m]))", "read {{tier}}"),
                (
                    "sum by (tier) (increase(crescent_tierd_corrupt_blocks_total[5m]))",
                    "corrupt {{tier}}",
                ),
            ),
            timeseries("S3 usable", "none", ("crescent_tierd_s3_up", "{{node}}")),
        ],
    ),
    (
        "kvindex",
        [
            timeseries(
                "KV event frames by outcome",
                "none",
                (
                    "sum by (outcome) (rate(crescent_kvindex_frames_total[1m]))",
                    "{{outcome}}/s",
                ),
                ("rate(crescent_kvindex_resyncs_asked_total[5m])", "resends asked/s"),
            ),
            timeseries("Blocks indexed by tier", "none", ("crescent_kvindex_blocks", "{{tier}}")),
            timeseries("Publishers known", "none", ("crescent_kvindex_publishers", "publishers")),
        ],
    ),
    (
        "Cache",
        [
            timeseries(
                "Hit ratio by tier",
                "percentunit",
                (
                    "sum by (tier) (rate(crescent_gateway_cached_prompt_tokens_by_tier_total[5m]))"
                    " / ignoring(tier) group_left sum(rate(crescent_gateway_prompt_tokens_total"
                    "[5m]))",
                    "{{tier}}",
                ),
            ),
            timeseries(
                "Bytes per tier",
                "bytes",
                ("sum by (tier) (crescent_tierd_used_bytes)", "{{tier}}"),
                ("sum(crescent_kv_cached_blocks * crescent_kv_block_bytes)", "dram (pools)"),
            ),
            timeseries(
                "Fetch or recompute: prompt tokens by where they came from",
                "short",
                (
                    "sum by (tier) (rate(crescent_cached_prompt_tokens_total[5m]))",
                    "fetched: {{tier}}",
                ),
                ("sum(rate(crescent_prompt_tokens_computed_total[5m]))", "computed"),
            ),
            timeseries(
                "Planned by the scheduler",
                "short",
                ("sum(rate(crescent_placed_cached_tokens_total[5m]))", "cached"),
                ("sum(rate(crescent_placed_prompt_tokens_total[5m]))", "prompt"),
                ("sum(rate(crescent_planned_pull_blocks_total[5m]))", "pull blocks"),
            ),
        ],
    ),
]


def alert_panels() -> list[dict[str, Any]]:
    """A stat panel per alerting rule, showing the rule's expression."""
    rules = yaml.safe_load((HERE.parent / "alerts.yml").read_text())["groups"][0]["rules"]
    return [stat(rule["alert"], rule["expr"]) for rule in rules]


def build() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    y, panel_id = 0, 1
    for title, row in [*ROWS, ("Alerts", alert_panels())]:
        panels.append(
            {
                "type": "row",
                "title": title,
                "id": panel_id,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        panel_id, y = panel_id + 1, y + 1
        width = 6 if title == "Alerts" else 8
        height = 4 if title == "Alerts" else 8
        for i, panel in enumerate(row):
            x = (i * width) % 24
            if i and x == 0:
                y += height
            panel["id"] = panel_id
            panel["gridPos"] = {"h": height, "w": width, "x": x, "y": y}
            panels.append(panel)
            panel_id += 1
        y += height
    return {
        "uid": "crescent",
        "title": "Crescent",
        "tags": ["crescent"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": []},
        "annotations": {"list": []},
        "panels": panels,
    }


if __name__ == "__main__":
    out = HERE / "dashboards" / "crescent.json"
    out.write_text(json.dumps(build(), indent=2) + "\n")
