"""tierd settings, read once at start from ``CRESCENT_*`` variables."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal, Self
from urllib.parse import urlsplit

from botocore.exceptions import BotoCoreError
from botocore.handlers import validate_bucket_name
from botocore.utils import is_valid_endpoint_url, is_valid_ipv6_endpoint_url, validate_region_name
from pydantic import Field, PrivateAttr, SecretStr, model_validator

from services.tierd.s3 import S3Config
from shared import subjects
from shared.nats_auth import NatsAuthSettings, own_id
from shared.secrets import (
    CacheMetaTokenSettings,
    CacheSecret,
    cache_secret_field,
    check_password,
    dev_mode,
    read_secret_file,
    refused,
)
from shared.tenants import parse_tenant_amounts

MB = 1 << 20


class TierdSettings(NatsAuthSettings, CacheMetaTokenSettings):
    """One host's tier daemon: where its tiers are, how big, and how blocks move.

    Invariant: after validation the tenant quotas are parsed and the S3 tier's configuration
    (keys read from their files included) is complete, so a bad setting stops tierd at start
    with a message naming the variable, never at its first sink or upload.
    """

    nats_url: str = Field(default="nats://127.0.0.1:4222", description="NATS server(s)")
    host_id: str = Field(default="", description="this machine's name; default: hostname")
    node_id: str = Field(default="", description="tierd's name; default: tierd-<host id>")
    cachemeta_url: str = Field(default="127.0.0.1:50051", description="host:port of cachemeta")
    transfer: Literal["ucx", "tcp"] = Field(default="ucx", description="KV transfer it serves")
    transfer_host: str = Field(default="127.0.0.1", description="interface the TCP server binds")
    metrics_port: int | None = Field(default=None, description="serve /healthz and /metrics here")
    metrics_host: str = Field(default="127.0.0.1", description="interface of the metrics port")
    heartbeat_interval_s: float = Field(default=1.0, gt=0, description="tierd's beat")
    cache_secret: CacheSecret = cache_secret_field(
        "key of the per-tenant cache salts (names the tenants of CRESCENT_TENANT_QUOTAS_MB)"
    )

    nvme_dir: Path = Field(default=Path("nvme"), description="where the NVMe tier's files live")
    nvme_capacity_mb: int = Field(default=10_240, ge=1, description="bytes the NVMe tier may use")
    nvme_high_watermark: float = Field(
        default=0.9, gt=0, le=1, description="NVMe use that starts moving blocks to S3"
    )
    nvme_low_watermark: float = Field(
        default=0.75, gt=0, le=1, description="NVMe use a round of moves brings it down to"
    )
    nvme_fsync: bool = Field(
        default=True, description="flush each block file to the device before it counts"
    )
    nvme_encrypt: bool = Field(
        default=True,
        description="encrypt block files per tenant (AES-256-GCM); off: token ids and KV in "
        "clear on disk, still authenticated with a keyed tag",
    )

    s3_endpoint: str = Field(default="", description="S3 server URL; empty: no S3 tier")
    s3_bucket: str = Field(default="crescent", description="bucket, created if missing")
    s3_prefix: str = Field(default="kv", description="object keys start with this")
    s3_region: str = Field(default="us-east-1", description="region the requests are signed for")
    s3_access_key: SecretStr | None = Field(default=None, description="S3 access key")
    s3_access_key_file: Path | None = Field(default=None, description="a file holding it")
    s3_secret_key: SecretStr | None = Field(default=None, description="S3 secret key")
    s3_secret_key_file: Path | None = Field(default=None, description="a file holding it")
    s3_capacity_mb: int = Field(default=0, ge=0, description="bytes S3 may hold; 0: unbounded")
    s3_concurrency: int = Field(default=8, ge=1, le=256, description="S3 requests in flight")
    s3_encrypt: bool = Field(
        default=True,
        description="encrypt objects per tenant (AES-256-GCM); off: token ids and KV in clear "
        "in the bucket, still authenticated with a keyed tag",
    )
    s3_ca_bundle: Path | None = Field(
        default=None,
        description="PEM file of the CAs the https endpoint's certificate must chain to; "
        "default: the system's",
    )
    s3_allow_http: bool = Field(
        default=False,
        description="allow a plain http:// endpoint that is not on loopback (objects and "
        "credentials' signatures then cross the network readable)",
    )

    sink_watermark: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="share of a pool's blocks that may lack a lower-tier copy before tierd "
        "takes the coldest down (0: every cached block goes down)",
    )
    sink_interval_s: float = Field(default=0.2, gt=0, description="how often pools are checked")
    sink_batch: int = Field(default=32, ge=1, le=4096, description="blocks per sink request")
    eviction_policy: Literal["lru", "lfu", "recompute", "crescent"] = Field(
        default="crescent", description="which blocks leave a tier first"
    )
    block_ttl_s: float = Field(
        default=7 * 86_400.0, gt=0, description="a block unused this long is deleted"
    )
    tenant_quota_mb: int = Field(
        default=0, ge=0, description="bytes each tenant may hold below DRAM; 0: no quota"
    )
    tenant_quotas_mb: str = Field(
        default="",
        description="per-tenant quotas overriding the default: name=MB,name=MB (0: no quota)",
    )
    staging_mb: int = Field(
        default=512, ge=16, description="memory for blocks read up and waiting to be pulled"
    )
    lease_ttl_s: float = Field(default=30.0, gt=0, description="read-up blocks wait this long")
    _quotas: dict[str, int] = PrivateAttr(default_factory=dict)
    _s3: S3Config | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.nvme_low_watermark > self.nvme_high_watermark:
            raise refused("CRESCENT_NVME_LOW_WATERMARK must not exceed the high watermark")
        amounts = parse_tenant_amounts(self.tenant_quotas_mb, "CRESCENT_TENANT_QUOTAS_MB", "MB")
        self._quotas = {name: mb * MB for name, mb in amounts.items()}
        self._s3 = self._build_s3_config()
        return self

    def resolved_host_id(self) -> str:
        return subjects.host_id(self.host_id)

    def resolved_node_id(self) -> str:
        given = own_id(self.node_id, self.nats_user)
        return subjects.check_token(given or f"tierd-{self.resolved_host_id()}", "node id")

    def tenant_quotas(self) -> dict[str, int]:
        """``CRESCENT_TENANT_QUOTAS_MB`` as tenant -> bytes."""
        return dict(self._quotas)

    def s3_config(self) -> S3Config | None:
        """The S3 tier's configuration, None without ``CRESCENT_S3_ENDPOINT``."""
        return self._s3

    def _build_s3_config(self) -> S3Config | None:
        if not self.s3_endpoint:
            return None
        _check_s3_location(self.s3_endpoint, self.s3_bucket, self.s3_region)
        _check_s3_transport(self.s3_endpoint, self.s3_allow_http, self.s3_ca_bundle)
        return S3Config(
            endpoint=self.s3_endpoint,
            bucket=self.s3_bucket,
            prefix=self.s3_prefix,
            access_key=_secret(self.s3_access_key, self.s3_access_key_file, "S3_ACCESS_KEY"),
            secret_key=_secret(self.s3_secret_key, self.s3_secret_key_file, "S3_SECRET_KEY"),
            region=self.s3_region,
            max_concurrency=self.s3_concurrency,
            ca_bundle=None if self.s3_ca_bundle is None else str(self.s3_ca_bundle),
        )


def _check_s3_location(endpoint: str, bucket: str, region: str) -> None:
    """Refuses, naming the variable, what the S3 client would refuse only when tierd first
    reaches for S3, where a malformed endpoint looks like a server that is down."""
    url = urlsplit(endpoint)
    try:
        url.port  # noqa: B018 -- parsing the port is the check
        valid = is_valid_endpoint_url(endpoint) or is_valid_ipv6_endpoint_url(endpoint)
    except ValueError:
        valid = False
    if url.scheme not in ("http", "https") or not valid:
        # Not echoed: an endpoint may carry credentials.
        raise refused("CRESCENT_S3_ENDPOINT must be an http:// or https:// URL with a host")
    try:
        validate_bucket_name({"Bucket": bucket})
    except BotoCoreError:
        raise refused(
            f"CRESCENT_S3_BUCKET {bucket!r} is no bucket name: "
            "1-255 letters, digits, '.', '-' or '_'"
        ) from None
    try:
        validate_region_name(region)
    except BotoCoreError:
        raise refused(f"CRESCENT_S3_REGION {region!r} is no region name") from None


def _check_s3_transport(endpoint: str, allow_http: bool, ca_bundle: Path | None) -> None:
    """Refuses plain http to anything but loopback unless allowed, and a CA bundle that
    cannot be read: both would otherwise show up only as failed or unprotected requests."""
    url = urlsplit(endpoint)
    if url.scheme == "http" and not allow_http and not _is_loopback(url.hostname or ""):
        raise refused(
            "CRESCENT_S3_ENDPOINT is plain http to a host that is not loopback: use https "
            "(CRESCENT_S3_CA_BUNDLE for a private CA) or set CRESCENT_S3_ALLOW_HTTP=true"
        )
    if ca_bundle is not None and not ca_bundle.is_file():
        raise refused(f"CRESCENT_S3_CA_BUNDLE {str(ca_bundle)!r} is not a readable file")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _secret(value: SecretStr | None, path: Path | None, name: str) -> str:
    """The S3 credential from its variable or its file; a known placeholder is refused
    outside development mode, wherever it came from."""
    if value is not None and value.get_secret_value():
        if path is not None:
            raise refused(f"set CRESCENT_{name} or CRESCENT_{name}_FILE, not both")
        given = value.get_secret_value()
    elif path is None:
        raise refused(f"an S3 endpoint needs CRESCENT_{name} or CRESCENT_{name}_FILE")
    else:
        try:
            given = read_secret_file(path, f"the file CRESCENT_{name}_FILE names")
        except ValueError as exc:
            raise refused(str(exc)) from None
    return check_password(given, f"CRESCENT_{name}", dev=dev_mode())
