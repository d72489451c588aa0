"""Prefill node settings: the shared node settings (``CRESCENT_*``), nothing of its own yet."""

from __future__ import annotations

from shared.node.settings import NodeSettings


class PrefillSettings(NodeSettings):
    pass
