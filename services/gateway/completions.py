"""Starts runs: the core behind both generation endpoints, and the gateway's own admission
(its cap on sequences in flight, and the schedulers' overload floor)."""

from __future__ import annotations

import time

import msgspec

from services.gateway import errors
from services.gateway.dispatch import Dispatcher
from services.gateway.flight import Flight
from services.gateway.requests import PreparedRequest
from services.gateway.service import Limits, Run
from services.gateway.tenant_limits import TenantCaps, TenantLimits
from shared.model.tokenizer import Tokenizer


class Completions:
    """Starts runs: the core behind both generation endpoints.

    Owns the dispatcher, the tokenizer used for output, the limits, the cap on sequences
    in flight (over it, a request is refused at once with 429) and each tenant's share
    (``tenants``): a run holds its share from ``start`` until ``finished``.
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        tokenizer: Tokenizer,
        limits: Limits,
        max_in_flight: int = 1024,
        tenant_caps: TenantCaps | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.tokenizer = tokenizer
        self.limits = limits
        self.max_in_flight = max_in_flight
        self.tenants = TenantLimits(tenant_caps or TenantCaps(sequences=max_in_flight))

    async def start(self, request: PreparedRequest) -> Run:
        """Submits the request and waits until it is accepted; the caller must ``close`` the
        returned run. On failure everything already sent is aborted before the error rises."""
        if len(self.dispatcher.in_flight) + len(request.choices) > self.max_in_flight:
            raise errors.rate_limited("The gateway has too many requests in flight.", 1.0)
        choices = request.choices
        reserved = sum(len(c.request.prompt_token_ids) + c.request.sampling.max_tokens
                       for c in choices)  # fmt: skip
        self.tenants.admit(request.id, choices[0].request.tenant, len(choices), reserved)
        try:
            return await self._start(request)
        except BaseException:
            self.tenants.release(request.id)
            raise

    def finished(self, run: Run) -> None:
        """Gives the run's tenant share back; called once its response has ended."""
        self.tenants.release(run.request.id)

    async def _start(self, request: PreparedRequest) -> Run:
        dispatcher = self.dispatcher
        if not dispatcher.connected:
            raise errors.unavailable("The gateway is not connected to the message bus.")
        retry_after = dispatcher.overloaded()
        if retry_after is not None:
            raise errors.rate_limited(
                "The servers are overloaded: no request can meet the time-to-first-token "
                "objective now; retry later.",
                retry_after,
            )
        # Nodes ask this gateway whether it still waits, and stop at the deadline anyway.
        deadline = time.time() + self.limits.request_timeout_s
        requests = [
            msgspec.structs.replace(
                c.request, gateway_id=dispatcher.gateway_id, deadline_ts=deadline
            )
            for c in request.choices
        ]
        flight = Flight.of(dispatcher, requests)
        liveness = dispatcher.liveness

        def alive(node: str, epoch: str, since: float) -> bool:
            return liveness.alive(node, dispatcher.clock(), epoch, since)

        run = Run(request, flight, self.tokenizer, self.limits, alive, dispatcher.clock)
        try:
            await run.accept()
        except BaseException:
            run.close()
            raise
        return run
