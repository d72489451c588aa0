"""Scheduler settings, read once at start from ``CRESCENT_*`` variables."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, PrivateAttr, model_validator

from services.scheduler.cluster import CostParams
from services.scheduler.keeping import KeepQuotas
from services.scheduler.saturation import REFERENCE_PROMPT_TOKENS, Objectives
from services.scheduler.timing import DEFAULT_PRIOR, StepCoefficients, StepTimes
from shared.nats_auth import NatsAuthSettings
from shared.secrets import CacheMetaTokenSettings, CacheSecret, cache_secret_field
from shared.tenants import parse_tenant_amounts


class SchedulerSettings(NatsAuthSettings, CacheMetaTokenSettings):
    nats_url: str = Field(default="nats://127.0.0.1:4222", description="NATS server(s)")
    metrics_port: int | None = Field(default=None, description="serve /healthz and /metrics here")
    metrics_host: str = Field(default="127.0.0.1", description="interface of the metrics port")
    heartbeat_timeout_s: float = Field(
        default=3.0, gt=0, description="silence before a node is dead"
    )
    cache_secret: CacheSecret = cache_secret_field(
        "key of the per-tenant cache salts; the same as the nodes'"
    )
    cachemeta_url: str = Field(
        default="", description="host:port of cachemeta; empty: place without regard to caches"
    )
    placement: Literal["cost", "round_robin"] = Field(
        default="cost",
        description="cost: cache-aware cost model; round_robin: the cache-oblivious baseline",
    )
    ttft_slo_ms: float | None = Field(
        default=None, gt=0, description="reject (429) requests predicted to exceed this TTFT"
    )
    tbt_slo_ms: float | None = Field(
        default=None,
        gt=0,
        description=(
            "reject (429) requests when every decode node is predicted, for when their prefill "
            "ends, to exceed this time between tokens or to lack room for their KV"
        ),
    )
    saturation_ttft_ms: float = Field(
        default=2000.0,
        gt=0,
        description="the time to first token a prefill node's saturation gauge counts as 1.0 "
        "while CRESCENT_TTFT_SLO_MS is unset",
    )
    saturation_tbt_ms: float = Field(
        default=100.0,
        gt=0,
        description="the time between tokens a decode node's saturation gauge counts as 1.0 "
        "while CRESCENT_TBT_SLO_MS is unset",
    )
    saturation_prompt_tokens: int = Field(
        default=REFERENCE_PROMPT_TOKENS,
        ge=1,
        le=1 << 24,
        description="the prompt a prefill node's saturation prices before this scheduler placed "
        "any request; after, the mean of its last 256 placements",
    )
    scheduler_id: str = Field(default="", description="unique name; default: random")
    ack_timeout_ms: float = Field(
        default=1000.0, gt=0, description="a prefill node silent this long gets no task"
    )
    heartbeat_interval_s: float = Field(default=1.0, gt=0, description="the scheduler's beat")
    warmup_s: float | None = Field(
        default=None,
        ge=0,
        description="listen to heartbeats this long before taking requests, unless a prefill "
        "and a decode node were heard sooner; default: the heartbeat timeout",
    )
    scheduler_max_pending: int = Field(
        default=256,
        ge=1,
        description="requests being placed at once; beyond it a request is refused (429) at once",
    )
    match_timeout_ms: float = Field(default=100.0, gt=0, description="cachemeta lookup budget")
    cachemeta_retry_s: float = Field(
        default=1.0, ge=0, description="after a failed lookup, place cache-obliviously this long"
    )
    max_num_batched_tokens: int = Field(
        default=2048, ge=1, description="tokens a node computes per step (the nodes' setting)"
    )
    default_fetch_bandwidth: float = Field(
        default=1e9, gt=0, description="bytes/s of a pull before any node measured one"
    )
    default_block_bytes: int = Field(
        default=32 * 46_080, ge=1, description="bytes of a KV block a node does not report"
    )
    pull_overhead_ms: float = Field(default=2.0, ge=0, description="fixed cost of one pull")
    nvme_read_bandwidth: float = Field(
        default=1.5e9, gt=0, description="bytes/s a tierd reads NVMe at before it measured any"
    )
    s3_read_bandwidth: float = Field(
        default=2.5e8, gt=0, description="bytes/s a tierd reads S3 at before it measured any"
    )
    nvme_latency_ms: float = Field(
        default=1.0, ge=0, description="what a read from a tierd's NVMe adds to a pull"
    )
    s3_latency_ms: float = Field(
        default=20.0, ge=0, description="what a read from a tierd's S3 adds to a pull"
    )
    prefetch: bool = Field(
        default=True,
        description="ask a tierd to move a placement's S3 blocks to NVMe while the request "
        "waits in its prefill node's queue, when the wait is long enough",
    )
    local_prefill: bool = Field(
        default=True,
        description="conditional disaggregation: let a decode node prefill a request itself, "
        "with no KV hand-off, when the measured costs say that is cheaper (a short prompt, or "
        "one the decode node already caches)",
    )
    local_prefill_stall_weight: float = Field(
        default=2.0,
        gt=0,
        description="how many seconds of a request's wait for its first token one second of "
        "a stream paused by a local prefill counts as: a decode node prefills a request "
        "itself when the weighed pause of its streams is less than the wait the request "
        "would see on a prefill node, both predicted",
    )
    local_prefill_max_pause_ms: float | None = Field(
        default=None,
        gt=0,
        description="an absolute bound on top: a decode node prefills a request itself only "
        "if that pauses the sequences it is decoding for at most this long; default: none",
    )
    local_prefill_max_idle_compute_ms: float = Field(
        default=2000.0,
        gt=0,
        description="a decode node with nothing decoding prefills a request itself only if "
        "its compute takes at most this long (streams handed to it meanwhile wait for those "
        "steps)",
    )
    step_prior_base_s: float = Field(
        default=DEFAULT_PRIOR.base_s, ge=0, description="step time before nodes report steps"
    )
    step_prior_per_token_s: float = Field(
        default=DEFAULT_PRIOR.per_token_s, ge=0, description="its cost per token computed"
    )
    step_prior_per_attention_s: float = Field(
        default=DEFAULT_PRIOR.per_attention_s, ge=0, description="its cost per token attended"
    )
    step_window: int = Field(default=256, ge=1, description="step samples kept per node")
    step_min_samples: int = Field(
        default=16, ge=1, description="below this, a node is predicted by its role's pooled fit"
    )
    keep_quota_blocks: int = Field(
        default=256,
        ge=0,
        le=(1 << 32) - 1,
        description="KV blocks each tenant may keep at once (cache_control.keep); 0: none",
    )
    keep_quotas: str = Field(
        default="",
        description="per-tenant keep quotas overriding the default: name=blocks,name=blocks",
    )
    _keep_quotas: dict[str, int] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> Self:
        self._keep_quotas = parse_tenant_amounts(self.keep_quotas, "CRESCENT_KEEP_QUOTAS", "blocks")
        return self

    def keep_quota(self) -> KeepQuotas:
        return KeepQuotas(self.keep_quota_blocks, dict(self._keep_quotas))

    @property
    def ttft_slo_s(self) -> float | None:
        return None if self.ttft_slo_ms is None else self.ttft_slo_ms / 1000

    @property
    def tbt_slo_s(self) -> float | None:
        return None if self.tbt_slo_ms is None else self.tbt_slo_ms / 1000

    def saturation_objectives(self) -> Objectives:
        """What the saturation gauges count as 1.0: the objectives, else their references."""
        ttft_ms = self.saturation_ttft_ms if self.ttft_slo_ms is None else self.ttft_slo_ms
        tbt_ms = self.saturation_tbt_ms if self.tbt_slo_ms is None else self.tbt_slo_ms
        return Objectives(ttft_s=ttft_ms / 1000, tbt_s=tbt_ms / 1000)

    def cost_params(self) -> CostParams:
        return CostParams(
            max_num_batched_tokens=self.max_num_batched_tokens,
            default_fetch_bandwidth=self.default_fetch_bandwidth,
            default_block_bytes=self.default_block_bytes,
            pull_overhead_s=self.pull_overhead_ms / 1000,
            nvme_read_bandwidth=self.nvme_read_bandwidth,
            s3_read_bandwidth=self.s3_read_bandwidth,
            nvme_latency_s=self.nvme_latency_ms / 1000,
            s3_latency_s=self.s3_latency_ms / 1000,
            local_prefill_stall_weight=self.local_prefill_stall_weight,
            local_prefill_max_pause_s=(
                None
                if self.local_prefill_max_pause_ms is None
                else self.local_prefill_max_pause_ms / 1000
            ),
            local_prefill_max_idle_compute_s=self.local_prefill_max_idle_compute_ms / 1000,
        )

    def step_times(self) -> StepTimes:
        prior = StepCoefficients(
            self.step_prior_base_s, self.step_prior_per_token_s, self.step_prior_per_attention_s
        )
        return StepTimes(prior, window=self.step_window, min_samples=self.step_min_samples)
