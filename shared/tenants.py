"""Per-tenant amounts in settings: ``name=N,name=N`` lists such as tierd's quotas below DRAM
and the scheduler's keep quotas, parsed and refused the same way everywhere."""

from __future__ import annotations

import re

from shared.secrets import refused


def parse_tenant_amounts(raw: str, variable: str, unit: str) -> dict[str, int]:
    """``name=N,name=N`` as tenant -> N; a tenant is one word, named once (a tenant whose name
    holds ``=`` or ``,`` cannot be given an amount of its own). ``variable`` and ``unit`` name
    the setting and its unit in the error."""
    amounts: dict[str, int] = {}
    for item in filter(None, (p.strip() for p in raw.split(","))):
        name, sep, size = item.partition("=")
        name, size = name.strip(), size.strip()
        if not sep or not name or not re.fullmatch(r"[0-9]+", size):
            raise refused(f"{variable}: {item!r} is not name={unit}")
        if any(c.isspace() for c in name):
            raise refused(f"{variable}: tenant {name!r} is not one word")
        if name in amounts:
            raise refused(f"{variable}: tenant {name!r} is listed twice")
        amounts[name] = int(size)
    return amounts
