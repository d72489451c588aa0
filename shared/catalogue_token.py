"""The rule of every service that answers catalogue queries: outside development mode it
holds the catalogue's token and refuses callers that do not present it."""

from __future__ import annotations

from shared.secrets import CacheMetaTokenSettings, refused


def require_token(settings: CacheMetaTokenSettings, dev: bool, service: str, dev_does: str) -> None:
    """Refuses ``service``'s settings without a token unless ``dev``; ``dev_does`` says what
    development mode does instead (the error names it)."""
    if settings.cachemeta_token_value() is None and not dev:
        raise refused(
            f"{service} needs CRESCENT_CACHEMETA_TOKEN or CRESCENT_CACHEMETA_TOKEN_FILE "
            f"(or CRESCENT_DEV_MODE=true to {dev_does})"
        )
