"""Secrets in settings: development mode, secret files, and validation errors that never echo a
secret.

Pydantic puts the offending input into every validation error (``input_value=...``), and those
errors end up in logs and on terminals. Every check here therefore raises its error with the
input replaced by ``REDACTED``, whatever the value was.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Self
from urllib.parse import unquote, urlsplit

from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from shared.flag_settings import ProcessFlags
from shared.service_settings import ServiceSettings

DEV_MODE_ENV = "CRESCENT_DEV_MODE"
#: The cache secret every process uses unless told otherwise; public, so only for development.
DEV_CACHE_SECRET = "crescent-dev-cache-secret"
#: Outside development mode a secret shorter than this is refused as guessable.
MIN_SECRET_CHARS = 16
REDACTED = "**********"
#: Values that shipped in Crescent's own files (compose, Kubernetes, docs) or are the first
#: guesses for a secret: anyone may know them, so none keys a deployment. Compared after
#: ``_normalized`` (lower case, letters and digits only).
KNOWN_PLACEHOLDERS = frozenset(
    {
        DEV_CACHE_SECRET,
        "change-me-in-production",
        "change-me-cachemeta-token",
        "replace-me-cache-secret",
        "replace-me-cachemeta-token",
        "replace-me-postgres-password",
        "replace-me-s3-secret-key",
        "trial-s3-secret-key",
        "trial-grafana-password",
        *(f"trial-{role}-password" for role in ("gateway", "scheduler", "prefill", "decode")),
        *(f"replace-me-{role}" for role in ("gateway", "scheduler", "prefill", "decode")),
        "crescent",
        "postgres",
        "password",
        "passw0rd",
        "secret",
        "example",
        "admin",
        "changeit",
        "letmein",
        "minioadmin",
    }
)
#: A value that contains one of these (normalized) was written as a stand-in, not chosen.
_PLACEHOLDER_MARKERS = ("changeme", "replaceme", "placeholder", "example", "yoursecret")
#: Nor does one that starts with one of these: how trial and sample values are usually named.
_PLACEHOLDER_PREFIXES = ("trial", "dummy", "sample", "insecure", "notasecret")
_FINGERPRINT_LABEL = b"crescent/cache-secret-fingerprint/v1"
_NOT_ALNUM = re.compile(r"[^a-z0-9]")


def dev_mode(environ: Mapping[str, str] | None = None) -> bool:
    """``CRESCENT_DEV_MODE``, parsed as pydantic parses a bool (true/false, 1/0, yes/no, on/off);
    absent means false. ``environ``: another environment than this process's."""
    return ProcessFlags.read(environ).dev_mode


def log_prompts(environ: Mapping[str, str] | None = None) -> bool:
    """``CRESCENT_LOG_PROMPTS``: whether logs may show what users sent and got (debugging)."""
    return ProcessFlags.read(environ).log_prompts


def loggable(content: str | Sequence[object], environ: Mapping[str, str] | None = None) -> str:
    """What a log line may say of a prompt, its token ids or a completion: the content itself
    only with ``CRESCENT_LOG_PROMPTS=true``, otherwise just its size."""
    if log_prompts(environ):
        return repr(content)
    unit = "characters" if isinstance(content, str) else "items"
    return f"<{len(content)} {unit}, hidden; CRESCENT_LOG_PROMPTS=true shows them>"


def read_secret_file(path: Path, what: str = "") -> str:
    """The secret held in ``path``, without surrounding whitespace (a trailing newline is how
    most editors and ``echo`` leave it). An unreadable or empty file is an error that names
    ``what`` (default: the path) — settings name their variable instead, since a secret put
    where a path belongs must not reach the error."""
    what = what or f"the secret file {path}"
    try:
        text = path.expanduser().read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {what}: {exc.__class__.__name__}") from None
    if not text:
        raise ValueError(f"{what} is empty")
    return text


def secret_fingerprint(secret: str) -> str:
    """A short keyed digest of a fixed label: equal for equal secrets, and safe to publish (it
    reveals nothing of the secret), so a process can tell that a peer uses another one."""
    return hmac.new(secret.encode(), _FINGERPRINT_LABEL, hashlib.sha256).hexdigest()[:16]


def refused(reason: str) -> ValidationError:
    """A validation error saying ``reason`` whose input is ``REDACTED``; raised inside a
    validator, pydantic reports it as is, at the field's location."""
    error = PydanticCustomError("secret_refused", "{reason}", {"reason": reason})
    return ValidationError.from_exception_data(
        "secret", [InitErrorDetails(type=error, input=REDACTED)]
    )


def _normalized(value: str) -> str:
    return _NOT_ALNUM.sub("", value.lower())


_KNOWN_NORMALIZED = frozenset(_normalized(known) for known in KNOWN_PLACEHOLDERS)


def is_placeholder(value: str) -> bool:
    """Whether ``value`` is a public stand-in rather than a secret: one that shipped in
    Crescent's files or docs, a common default (``password``, ``crescent`` ...), or one
    written as such (``change-me...``, ``replace-me...``, ``trial-...``, ``...example...``)."""
    plain = _normalized(value)
    if not plain:
        return False
    if plain in _KNOWN_NORMALIZED:
        return True
    return any(m in plain for m in _PLACEHOLDER_MARKERS) or plain.startswith(_PLACEHOLDER_PREFIXES)


def placeholder_reason(name: str) -> str:
    """The error for a placeholder given as ``name``: it says what to do, never the value."""
    return (
        f"{name} is a known placeholder or default value, public to anyone who read "
        "Crescent's files; generate a secret (`crescent secrets`) and set that instead "
        f"(or {DEV_MODE_ENV}=true for development)"
    )


def check_password(value: str, name: str, *, dev: bool) -> str:
    """``value`` unless it is a known placeholder outside development mode; unlike
    ``check_secret`` no length is required (for credentials of servers Crescent does not
    run, whose rules are their own)."""
    if not dev and is_placeholder(value):
        raise refused(placeholder_reason(name))
    return value


def check_db_url(url: str, *, dev: bool, name: str = "CRESCENT_DB_URL") -> str:
    """``url`` unless, outside development mode, it is a server URL (Postgres, MySQL ...)
    whose password is a known placeholder or default (``crescent:crescent@`` shipped as the
    trial one). A URL without a password (SQLite, or credentials from elsewhere) passes."""
    if dev:
        return url
    try:
        password = urlsplit(url).password
    except ValueError:
        # Malformed: left to the database driver, whose error shows no password either.
        return url
    if password is not None and is_placeholder(unquote(password)):
        raise refused(placeholder_reason(f"the password in {name}"))
    return url


def check_secret(value: str, name: str, *, dev: bool, dev_value: str | None = None) -> str:
    """``value`` if it may key a deployment: outside development mode it is not the public
    development value, nor a known placeholder (``is_placeholder``), and has at least
    ``MIN_SECRET_CHARS`` characters. The error names ``name`` and the rule, never the value."""
    if dev:
        if not value:
            raise refused(f"{name} must not be empty")
        return value
    if dev_value is not None and hmac.compare_digest(value.encode(), dev_value.encode()):
        raise refused(
            f"{name} is the public development value; set your own secret "
            f"(or {DEV_MODE_ENV}=true for development)"
        )
    if is_placeholder(value):
        raise refused(placeholder_reason(name))
    if len(value) < MIN_SECRET_CHARS:
        raise refused(
            f"{name} is too short: at least {MIN_SECRET_CHARS} characters outside development "
            f"mode ({DEV_MODE_ENV}=true)"
        )
    return value


def _validate_cache_secret(
    value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo
) -> str:
    try:
        text = handler(value)
    except ValidationError:
        raise refused("the cache secret must be a string") from None
    # A settings class with its own dev_mode field (declared before this one) decides;
    # otherwise the environment does, as it does for every service.
    dev = _dev_mode_of(info.data.get("dev_mode"))
    return check_secret(text, "CRESCENT_CACHE_SECRET", dev=dev, dev_value=DEV_CACHE_SECRET)


def _dev_mode_of(field: object) -> bool:
    """A settings class's own ``dev_mode`` field, else the environment's; a malformed one is
    refused here, since a plain ValueError would be reported with the secret as its input."""
    if isinstance(field, bool):
        return field
    try:
        return dev_mode()
    except ValueError as exc:
        raise refused(str(exc)) from None


#: The type of a ``cache_secret`` settings field: a str that outside development mode is
#: neither ``DEV_CACHE_SECRET`` nor short, validated without ever echoing it.
CacheSecret = Annotated[str, WrapValidator(_validate_cache_secret)]


def cache_secret_field(description: str) -> Any:
    """The ``cache_secret`` field with its development default, validated even when defaulted."""
    return Field(default=DEV_CACHE_SECRET, validate_default=True, description=description)


class CacheMetaTokenSettings(ServiceSettings):
    """The shared token of cachemeta's gRPC calls, as the server and its clients read it:
    ``CRESCENT_CACHEMETA_TOKEN`` or ``CRESCENT_CACHEMETA_TOKEN_FILE``, never both.

    Invariant: after validation ``cachemeta_token_value()`` is the token (from either source)
    or None when neither is set; outside development mode a token is never short.
    """

    cachemeta_token: SecretStr | None = Field(
        default=None, description="shared token of cachemeta's gRPC calls"
    )
    cachemeta_token_file: Path | None = Field(
        default=None, description="a file holding the cachemeta token"
    )

    @model_validator(mode="after")
    def _load_cachemeta_token(self) -> Self:
        # An empty variable (as compose leaves an unset one) is no token.
        token = self.cachemeta_token.get_secret_value() if self.cachemeta_token else None
        token = token or None
        if token is not None and self.cachemeta_token_file is not None:
            raise refused("set CRESCENT_CACHEMETA_TOKEN or CRESCENT_CACHEMETA_TOKEN_FILE, not both")
        if self.cachemeta_token_file is not None:
            try:
                token = read_secret_file(
                    self.cachemeta_token_file, "the file CRESCENT_CACHEMETA_TOKEN_FILE names"
                )
            except ValueError as exc:
                raise refused(str(exc)) from None
        if token is not None:
            check_secret(
                token, "the cachemeta token", dev=_dev_mode_of(getattr(self, "dev_mode", None))
            )
        self.cachemeta_token = None if token is None else SecretStr(token)
        return self

    def cachemeta_token_value(self) -> str | None:
        return None if self.cachemeta_token is None else self.cachemeta_token.get_secret_value()
