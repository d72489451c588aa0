"""The observability kit: deploy/prometheus.yml scrapes every service of docker-compose,
deploy/alerts.yml names metrics the services export and has a runbook entry per alert, the
Grafana dashboard JSON passes its schema and is what deploy/grafana/dashboard.py builds, and
the compose profile `observability` adds Prometheus and Grafana wired to them."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from tests.deploy.test_compose import ROOT, compose

DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "crescent.json"
#: The services that serve /metrics (NATS, Postgres and S3 are not Crescent's).
SCRAPED = ("gateway", "scheduler", "prefill", "decode", "cachemeta", "tierd", "kvindex")
ROWS = [
    "Gateway",
    "Scheduler",
    "Prefill and decode nodes",
    "cachemeta",
    "tierd",
    "kvindex",
    "Cache",
]

TARGET = {
    "type": "object",
    "required": ["refId", "expr", "datasource"],
    "properties": {"refId": {"type": "string"}, "expr": {"type": "string", "minLength": 1}},
}
GRID = {
    "type": "object",
    "required": ["h", "w", "x", "y"],
    "properties": {
        "w": {"type": "integer", "minimum": 1, "maximum": 24},
        "x": {"type": "integer", "minimum": 0, "maximum": 23},
        "h": {"type": "integer", "minimum": 1},
        "y": {"type": "integer", "minimum": 0},
    },
}
#: What Grafana needs of a provisioned dashboard (the parts of its dashboard schema used here).
SCHEMA = {
    "type": "object",
    "required": ["uid", "title", "schemaVersion", "panels", "time"],
    "properties": {
        "uid": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,40}$"},
        "schemaVersion": {"type": "integer", "minimum": 36},
        "panels": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "type", "title", "gridPos"],
                "properties": {
                    "id": {"type": "integer"},
                    "type": {"enum": ["row", "timeseries", "stat"]},
                    "gridPos": GRID,
                    "targets": {"type": "array", "minItems": 1, "items": TARGET},
                },
                "if": {"properties": {"type": {"const": "row"}}},
                "then": {"required": ["panels", "collapsed"]},
                "else": {"required": ["targets", "datasource"]},
            },
        },
    },
}


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def alert_rules() -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = yaml.safe_load((DEPLOY / "alerts.yml").read_text())["groups"][0][
        "rules"
    ]
    return rules


def exported_names() -> set[str]:
    """Metric names the code defines: ``"crescent_..."`` literals, and the short names the
    node and tierd collectors prefix with ``crescent_`` and ``crescent_tierd_``."""
    names: set[str] = set()
    for path in [*(ROOT / "services").rglob("*.py"), *(ROOT / "shared").rglob("*.py")]:
        names |= set(re.findall(r'"(crescent_[a-z0-9_]+)"', path.read_text()))
    for path, prefix in (
        (ROOT / "shared" / "node" / "metrics.py", "crescent_"),
        (ROOT / "services" / "tierd" / "metrics.py", "crescent_tierd_"),
    ):
        names |= {prefix + n for n in re.findall(r'\(\s*"([a-z][a-z0-9_]+)"', path.read_text())}
    return names


def referenced(expr: str) -> set[str]:
    """The crescent metric families a PromQL expression reads."""
    found = set(re.findall(r"\bcrescent_[a-z0-9_]+", expr))
    return {re.sub(r"_(total|bucket|sum|count)$", "", name) for name in found}


def test_the_dashboard_passes_its_schema_with_a_row_per_service_and_the_alerts() -> None:
    board = dashboard()
    jsonschema.validate(board, SCHEMA)
    panels = board["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    assert [p["title"] for p in panels if p["type"] == "row"] == [*ROWS, "Alerts"]
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
    titles = {p["title"] for p in panels}
    assert {r["alert"] for r in alert_rules()} <= titles
    provisioned = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )
    uid = provisioned["datasources"][0]["uid"]
    assert {p["datasource"]["uid"] for p in panels if p["type"] != "row"} == {uid}


def test_a_broken_dashboard_fails_the_schema() -> None:
    board = dashboard()
    board["panels"][1].pop("targets")
    try:
        jsonschema.validate(board, SCHEMA)
    except jsonschema.ValidationError:
        return
    raise AssertionError("a panel without queries passed")


def test_the_dashboard_is_what_its_builder_writes() -> None:
    spec = importlib.util.spec_from_file_location("dashboard", DEPLOY / "grafana" / "dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.build() == dashboard(), "run `python deploy/grafana/dashboard.py`"


def test_every_metric_the_dashboard_and_alerts_read_is_exported() -> None:
    exported = exported_names()
    assert "crescent_kv_transfer_bytes" in exported and "crescent_tierd_used_bytes" in exported
    exprs = [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]
    exprs += [r["expr"] for r in alert_rules()]
    for expr in exprs:
        missing = referenced(expr) - exported
        assert not missing, f"{expr} reads {sorted(missing)}, which nothing exports"


def test_each_alert_has_a_runbook_entry() -> None:
    operations = (ROOT / "docs" / "operations.md").read_text()
    headings = {h.strip().lower() for h in re.findall(r"^### (.+)$", operations, re.M)}
    for rule in alert_rules():
        assert rule["alert"].lower() in headings, f"no runbook entry for {rule['alert']}"
        anchor = rule["annotations"]["runbook"].split("#")[1]
        assert anchor == rule["alert"].lower()


def test_prometheus_scrapes_every_service_by_its_compose_name() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    hosts: set[str] = set()
    for job in config["scrape_configs"]:
        for static in job.get("static_configs", []):
            hosts |= {t.split(":")[0] for t in static["targets"]}
        for sd in job.get("dns_sd_configs", []):
            hosts |= set(sd["names"])
    assert hosts == set(SCRAPED)
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]


def test_the_observability_profile_adds_prometheus_and_grafana() -> None:
    plain = compose("config", "--format", "json")
    assert plain.returncode == 0, plain.stderr
    assert not {"prometheus", "grafana"} & set(json.loads(plain.stdout)["services"])
    done = compose("--profile", "observability", "config", "--format", "json")
    assert done.returncode == 0, done.stderr
    services = json.loads(done.stdout)["services"]
    for name in ("prometheus", "grafana"):
        assert services[name]["healthcheck"]["test"], name
        for mount in services[name]["volumes"]:
            if mount["type"] == "bind":
                assert Path(mount["source"]).exists(), mount["source"]
    mounted = {m["target"] for m in services["prometheus"]["volumes"]}
    assert {"/etc/prometheus/prometheus.yml", "/etc/prometheus/alerts.yml"} <= mounted
    assert set(SCRAPED) <= set(services)
