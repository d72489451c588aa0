"""How the UCX transport configures UCX: endpoint error handling and the UCX settings it needs.

``CRESCENT_UCX_ERROR_HANDLING`` chooses between two configurations (``bench/transfer.py``
measures both, see docs/benchmarks.md):

* ``peer`` (default): endpoints are made with UCX's peer error handling, so a peer that dies
  fails the pulls and sends in flight to it, and its endpoint, instead of the process. On its
  own that makes UCX leave shared memory for TCP, so the transport also tells the
  shared-memory transports to take part (below); messages still go through a shared-memory
  FIFO and blocks are still copied straight out of the server's memory (CMA).
* ``off``: endpoints without error handling, on UCX's older protocol layer. Somewhat faster,
  but a peer that dies in the middle of a pull is noticed only when the pull times out, and can
  leave the puller's worker unable to complete pulls from live peers; on the newer layer it
  aborts the puller (the CMA read of the dead peer's memory is fatal). For hosts where every
  process lives and dies together.

Every setting here is a default: a ``UCX_*`` variable already in the environment wins. Both
ends of a pull must use the same mode: UCX refuses endpoints whose error handling differs.
``UcxSettings`` reads this mode and the progress mode (``ucx_progress``) once, when UCX loads.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

from pydantic import Field, ValidationInfo, field_validator

from shared.service_settings import ServiceSettings
from shared.transfer.base import TransferError
from shared.transfer.ucx_progress import DEFAULT_MODE as DEFAULT_PROGRESS
from shared.transfer.ucx_progress import MODES as PROGRESS_MODES

MODES = ("peer", "off")
DEFAULT_MODE = "peer"

# Always: ucxx sets UCX_MEMTYPE_CACHE, which this UCX no longer knows and warns about.
_COMMON = {"UCX_WARN_UNUSED_ENV_VARS": "n"}
_SAFE = {
    # The newer protocol layer fails a pull whose CMA read finds the peer gone. The older one
    # (measured) lets that pull time out, and in some runs then completes no pull from live
    # peers either.
    "UCX_PROTO_ENABLE": "y",
    # sysv and posix FIFOs can only notice a dead peer by checking that its process still
    # exists, on keepalive rounds; unless told that this is enough, UCX drops them for TCP.
    "UCX_MM_ERROR_HANDLING": "y",
    # With error handling on, UCX reads a rendezvous only through memory it could revoke if
    # the send failed. CMA cannot revoke (a peer still alive may read a block after its send
    # failed), which costs nothing here: block bytes are checksummed by the callers anyway.
    "UCX_CMA_MEMORY_INVALIDATE": "y",
    # How soon an idle peer's death is noticed (UCX's default is 20 s, longer than a pull's
    # timeout): until then each pull to it waits out its timeout. A round checks at most
    # UCX_KEEPALIVE_NUM_EPS endpoints (default 128), about one per peer process.
    "UCX_KEEPALIVE_INTERVAL": "1s",
}
_UNSAFE = {
    # The older protocol layer copies CMA rendezvous faster than the newer (docs/benchmarks.md).
    "UCX_PROTO_ENABLE": "n",
}


#: Each field's modes and default.
_CHOICES = {
    "ucx_progress": (PROGRESS_MODES, DEFAULT_PROGRESS),
    "ucx_error_handling": (MODES, DEFAULT_MODE),
}


class UcxSettings(ServiceSettings):
    """How this process's UCX transport runs: who progresses its worker, and how endpoints
    handle a peer's death. Invariant: each field is one of its modes, in lower case; a blank
    variable is the default and anything else is refused, naming the variable."""

    ucx_progress: str = Field(default=DEFAULT_PROGRESS, description="who progresses UCX")
    ucx_error_handling: str = Field(default=DEFAULT_MODE, description="UCX endpoint errors")

    @field_validator("ucx_progress", "ucx_error_handling", mode="before")
    @classmethod
    def _mode(cls, value: object, info: ValidationInfo) -> str:
        modes, default = _CHOICES[info.field_name or ""]
        mode = str(value).strip().lower() or default
        if mode not in modes:
            # A TransferError, not a validation error: loading UCX reports its errors so.
            name = f"CRESCENT_{(info.field_name or '').upper()}"
            raise TransferError(f"unknown {name} {mode!r}; expected one of {', '.join(modes)}")
        return mode


def ucx_defaults(mode: str) -> dict[str, str]:
    """The UCX settings the transport sets for ``mode`` unless the environment has them."""
    return {**_COMMON, **(_SAFE if mode == "peer" else _UNSAFE)}


def apply_defaults(mode: str, environ: MutableMapping[str, str] | None = None) -> None:
    """Put ``mode``'s UCX settings into the environment (this process's when None), before
    UCX reads it: the one place the transport writes an environment."""
    env = os.environ if environ is None else environ
    for key, value in ucx_defaults(mode).items():
        env.setdefault(key, value)
