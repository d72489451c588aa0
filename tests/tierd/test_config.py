"""tierd's settings: defaults, CRESCENT_* parsing, tenant quotas, and an S3 tier whose every
setting (keys from files included) is checked when the settings are read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from services.tierd.config import MB, TierdSettings
from shared import subjects
from shared.secrets import DEV_CACHE_SECRET

SECRET_KEY = "s3-secret-7d1e0b9a4c2f5e38"
ACCESS_KEY = "tierd-access"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only what a test sets: no CRESCENT_* variable of the machine running the tests."""
    for name in list(os.environ):
        if name.startswith("CRESCENT_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("CRESCENT_DEV_MODE", "true")


def error_text(info: pytest.ExceptionInfo[ValidationError]) -> str:
    return f"{info.value}\n{info.value.json()}\n{info.value.errors()!r}"


def with_s3(monkeypatch: pytest.MonkeyPatch, **extra: str) -> None:
    monkeypatch.setenv("CRESCENT_S3_ENDPOINT", "http://127.0.0.1:8333")
    for name, value in extra.items():
        monkeypatch.setenv(f"CRESCENT_{name.upper()}", value)


def test_defaults() -> None:
    s = TierdSettings()
    assert s.nats_url == "nats://127.0.0.1:4222"
    assert s.resolved_host_id() == subjects.host_id("")
    assert s.resolved_node_id() == f"tierd-{subjects.host_id('')}"
    assert s.nvme_dir == Path("nvme") and s.nvme_capacity_mb == 10_240 and s.nvme_fsync
    assert (s.nvme_high_watermark, s.nvme_low_watermark) == (0.9, 0.75)
    assert s.eviction_policy == "crescent" and s.block_ttl_s == 7 * 86_400
    assert s.tenant_quota_mb == 0 and s.tenant_quotas() == {}
    assert s.s3_config() is None  # no endpoint: no S3 tier
    assert (s.staging_mb, s.lease_ttl_s) == (512, 30.0)
    assert (s.sink_watermark, s.sink_batch) == (0.0, 32)
    assert s.cache_secret == DEV_CACHE_SECRET and s.cachemeta_token_value() is None


def test_env_variables_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    values = {
        "HOST_ID": "rack1.host7",
        "NVME_DIR": "/var/lib/crescent/nvme",
        "NVME_CAPACITY_MB": "64",
        "NVME_HIGH_WATERMARK": "0.8",
        "NVME_LOW_WATERMARK": "0.5",
        "NVME_FSYNC": "false",
        "EVICTION_POLICY": "lru",
        "BLOCK_TTL_S": "3600",
        "TENANT_QUOTA_MB": "5",
        "TENANT_QUOTAS_MB": " alice=10, bob=0 ,,",
        "S3_CAPACITY_MB": "100",
        "STAGING_MB": "32",
    }
    for name, value in values.items():
        monkeypatch.setenv(f"CRESCENT_{name}", value)
    s = TierdSettings()
    assert s.resolved_host_id() == "rack1-host7" and s.resolved_node_id() == "tierd-rack1-host7"
    assert s.nvme_dir == Path("/var/lib/crescent/nvme") and s.nvme_capacity_mb == 64
    assert (s.nvme_high_watermark, s.nvme_low_watermark, s.nvme_fsync) == (0.8, 0.5, False)
    assert (s.eviction_policy, s.block_ttl_s, s.tenant_quota_mb) == ("lru", 3600, 5)
    assert s.tenant_quotas() == {"alice": 10 * MB, "bob": 0}
    assert (s.s3_capacity_mb, s.staging_mb) == (100, 32)
    # A copy: callers cannot change the settings through it.
    s.tenant_quotas()["carol"] = 1
    assert "carol" not in s.tenant_quotas()


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("EVICTION_POLICY", "fifo", "eviction_policy"),
        ("NVME_CAPACITY_MB", "0", "nvme_capacity_mb"),
        ("NVME_HIGH_WATERMARK", "1.5", "nvme_high_watermark"),
        ("NVME_LOW_WATERMARK", "0.95", "must not exceed the high watermark"),
        ("STAGING_MB", "8", "staging_mb"),
        ("S3_CONCURRENCY", "0", "s3_concurrency"),
        ("SINK_WATERMARK", "1", "sink_watermark"),
        ("LEASE_TTL_S", "0", "lease_ttl_s"),
        ("TRANSFER", "smoke-signals", "transfer"),
    ],
)
def test_values_out_of_range_are_refused(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, says: str
) -> None:
    monkeypatch.setenv(f"CRESCENT_{name}", value)
    with pytest.raises(ValidationError, match=says):
        TierdSettings()


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("alice", "'alice' is not name=MB"),
        ("alice=", "'alice=' is not name=MB"),
        ("=5", "'=5' is not name=MB"),
        ("alice=5MB", "'alice=5MB' is not name=MB"),
        ("alice=-1", "'alice=-1' is not name=MB"),
        ("alice=1.5", "'alice=1.5' is not name=MB"),
        ("alice=\u00b2", "is not name=MB"),  # a digit to str.isdigit, not to int()
        ("alice=1;bob=2", "'alice=1;bob=2' is not name=MB"),
        ("alice=bob=2", "is not name=MB"),
        ("al ice=1", "tenant 'al ice' is not one word"),
        ("alice=1, alice=2", "tenant 'alice' is listed twice"),
    ],
)
def test_a_malformed_quota_list_fails_at_start_naming_the_entry(
    monkeypatch: pytest.MonkeyPatch, raw: str, says: str
) -> None:
    monkeypatch.setenv("CRESCENT_TENANT_QUOTAS_MB", raw)
    with pytest.raises(ValidationError, match="CRESCENT_TENANT_QUOTAS_MB") as info:
        TierdSettings()
    assert says in str(info.value)
    assert len(info.value.errors()) == 1


def test_s3_keys_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    with_s3(
        monkeypatch,
        s3_access_key=ACCESS_KEY,
        s3_secret_key=SECRET_KEY,
        s3_bucket="kv-blocks",
        s3_prefix="host7",
        s3_region="eu-west-3",
        s3_concurrency="4",
    )
    s = TierdSettings()
    config = s.s3_config()
    assert config is not None
    assert (config.endpoint, config.bucket, config.prefix) == (
        "http://127.0.0.1:8333",
        "kv-blocks",
        "host7",
    )
    assert (config.access_key, config.secret_key) == (ACCESS_KEY, SECRET_KEY)
    assert (config.region, config.max_concurrency) == ("eu-west-3", 4)
    assert SECRET_KEY not in repr(s) and SECRET_KEY not in repr(config)
    assert s.s3_config() is config  # built once, at start


def test_s3_keys_from_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    access, secret = tmp_path / "access", tmp_path / "secret"
    access.write_text(f"{ACCESS_KEY}\n")
    secret.write_text(f"  {SECRET_KEY}\n\n")
    # An empty variable (compose leaves an unset one so) does not count as set.
    with_s3(
        monkeypatch,
        s3_access_key="",
        s3_access_key_file=str(access),
        s3_secret_key_file=str(secret),
    )
    config = TierdSettings().s3_config()
    assert config is not None
    assert (config.access_key, config.secret_key) == (ACCESS_KEY, SECRET_KEY)


def test_a_key_given_twice_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text(SECRET_KEY)
    with_s3(
        monkeypatch,
        s3_access_key=ACCESS_KEY,
        s3_secret_key=SECRET_KEY,
        s3_secret_key_file=str(secret),
    )
    with pytest.raises(
        ValidationError, match="CRESCENT_S3_SECRET_KEY or CRESCENT_S3_SECRET_KEY_FILE, not both"
    ) as info:
        TierdSettings()
    assert SECRET_KEY not in error_text(info)


@pytest.mark.parametrize("missing", ["S3_ACCESS_KEY", "S3_SECRET_KEY"])
def test_an_s3_endpoint_without_a_key_fails_at_start(
    monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    keys = {"s3_access_key": ACCESS_KEY, "s3_secret_key": SECRET_KEY}
    del keys[missing.lower()]
    with_s3(monkeypatch, **keys)
    with pytest.raises(
        ValidationError, match=f"needs CRESCENT_{missing} or CRESCENT_{missing}_FILE"
    ):
        TierdSettings()
    # Without an endpoint there is no S3 tier, and keys are not needed.
    monkeypatch.delenv("CRESCENT_S3_ENDPOINT")
    assert TierdSettings().s3_config() is None


def test_an_unreadable_or_empty_key_file_fails_at_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with_s3(monkeypatch, s3_access_key=ACCESS_KEY, s3_secret_key_file=str(tmp_path / "absent"))
    with pytest.raises(ValidationError, match="cannot read the file CRESCENT_S3_SECRET_KEY_FILE"):
        TierdSettings()
    empty = tmp_path / "empty"
    empty.write_text("\n")
    monkeypatch.setenv("CRESCENT_S3_SECRET_KEY_FILE", str(empty))
    with pytest.raises(ValidationError, match="CRESCENT_S3_SECRET_KEY_FILE names is empty"):
        TierdSettings()


@pytest.mark.parametrize(
    "endpoint",
    ["127.0.0.1:8333", "s3:8333", "ftp://s3:8333", "http://", "http://s3:99999", "http://s 3:1"],
)
def test_a_malformed_s3_endpoint_fails_at_start(
    monkeypatch: pytest.MonkeyPatch, endpoint: str
) -> None:
    with_s3(monkeypatch, s3_access_key=ACCESS_KEY, s3_secret_key=SECRET_KEY)
    monkeypatch.setenv("CRESCENT_S3_ENDPOINT", endpoint)
    with pytest.raises(ValidationError, match="CRESCENT_S3_ENDPOINT must be an http"):
        TierdSettings()


def test_a_malformed_endpoint_is_not_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    # Credentials put into the URL must not reach a log through the error.
    with_s3(monkeypatch, s3_access_key=ACCESS_KEY, s3_secret_key=SECRET_KEY)
    monkeypatch.setenv("CRESCENT_S3_ENDPOINT", f"http://{ACCESS_KEY}:{SECRET_KEY}@s 3:1")
    with pytest.raises(ValidationError, match="CRESCENT_S3_ENDPOINT") as info:
        TierdSettings()
    assert SECRET_KEY not in error_text(info)


@pytest.mark.parametrize(
    "endpoint", ["https://s3.example.com", "http://[::1]:8333", "http://localhost:8333/"]
)
def test_well_formed_endpoints_pass(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    with_s3(monkeypatch, s3_access_key=ACCESS_KEY, s3_secret_key=SECRET_KEY)
    monkeypatch.setenv("CRESCENT_S3_ENDPOINT", endpoint)
    config = TierdSettings().s3_config()
    assert config is not None and config.endpoint == endpoint


def test_plain_http_off_loopback_needs_an_explicit_yes(monkeypatch: pytest.MonkeyPatch) -> None:
    with_s3(monkeypatch, s3_access_key=ACCESS_KEY, s3_secret_key=SECRET_KEY)
    monkeypatch.setenv("CRESCENT_S3_ENDPOINT", "http://s3:8333/")
    with pytest.raises(ValidationError, match="plain http to a host that is not loopback"):
        TierdSettings()
    monkeypatch.setenv("CRESCENT_S3_ALLOW_HTTP", "true")
    config = TierdSettings().s3_config()
    assert config is not None and config.endpoint == "http://s3:8333/"


def test_a_ca_bundle_is_checked_at_start(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with_s3(monkeypatch, s3_access_key=ACCESS_KEY, s3_secret_key=SECRET_KEY)
    monkeypatch.setenv("CRESCENT_S3_ENDPOINT", "https://s3.example.com")
    monkeypatch.setenv("CRESCENT_S3_CA_BUNDLE", str(tmp_path / "none.pem"))
    with pytest.raises(ValidationError, match="CRESCENT_S3_CA_BUNDLE"):
        TierdSettings()
    (tmp_path / "ca.pem").write_text("pem")
    monkeypatch.setenv("CRESCENT_S3_CA_BUNDLE", str(tmp_path / "ca.pem"))
    config = TierdSettings().s3_config()
    assert config is not None and config.ca_bundle == str(tmp_path / "ca.pem")


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("S3_BUCKET", "my bucket", "CRESCENT_S3_BUCKET 'my bucket' is no bucket name"),
        ("S3_BUCKET", "", "CRESCENT_S3_BUCKET '' is no bucket name"),
        ("S3_REGION", "eu west", "CRESCENT_S3_REGION 'eu west' is no region name"),
    ],
)
def test_a_bucket_or_region_the_client_would_refuse_fails_at_start(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, says: str
) -> None:
    with_s3(monkeypatch, s3_access_key=ACCESS_KEY, s3_secret_key=SECRET_KEY)
    monkeypatch.setenv(f"CRESCENT_{name}", value)
    with pytest.raises(ValidationError, match=says):
        TierdSettings()


def test_production_refuses_the_development_cache_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRESCENT_DEV_MODE", "false")
    with pytest.raises(ValidationError, match="public development value"):
        TierdSettings()
    monkeypatch.setenv("CRESCENT_CACHE_SECRET", "a-long-production-cache-secret-0123")
    assert TierdSettings().cache_secret == "a-long-production-cache-secret-0123"
