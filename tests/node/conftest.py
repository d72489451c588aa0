"""Node tests run the prefill and decode services on tiny engines in one process."""

from __future__ import annotations

import os

from tests.engine.conftest import make_engine, tiny_model

os.environ.setdefault("CRESCENT_DEV_MODE", "true")

__all__ = ["make_engine", "tiny_model"]
