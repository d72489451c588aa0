"""Decode node settings: the shared node settings (``CRESCENT_*``) and its own."""

from __future__ import annotations

from pydantic import Field

from shared.node.settings import NodeSettings


class DecodeSettings(NodeSettings):
    local_prefill: bool = Field(
        default=True,
        description="take prefill tasks of its own from the scheduler (conditional "
        "disaggregation), so short or cached prompts need no KV hand-off",
    )
