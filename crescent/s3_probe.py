"""One signed S3 request, with nothing but the standard library: whether a bucket exists for
the holder of a key pair. ``crescent up`` asks it of the S3 server it starts, because the server
answers its health check before it has made the stack's bucket."""

from __future__ import annotations

import hashlib
import hmac
import http.client
import time
from urllib.parse import urlsplit

REGION = "us-east-1"
_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_SIGNED_HEADERS = "host;x-amz-content-sha256;x-amz-date"


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def _signature(secret_key: str, day: str, string_to_sign: str) -> str:
    key = _hmac(("AWS4" + secret_key).encode(), day)
    for part in (REGION, "s3", "aws4_request"):
        key = _hmac(key, part)
    return hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()


def signed_headers(
    method: str, host: str, path: str, access_key: str, secret_key: str, now: float
) -> dict[str, str]:
    """AWS Signature Version 4 headers of a request with no query and no body."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    day = stamp[:8]
    headers = [f"host:{host}", f"x-amz-content-sha256:{_EMPTY_SHA256}", f"x-amz-date:{stamp}"]
    # method, path, query (none), headers, a blank line, their names, the body's hash
    canonical = "\n".join([method, path, "", *headers, "", _SIGNED_HEADERS, _EMPTY_SHA256])
    scope = f"{day}/{REGION}/s3/aws4_request"
    digest = hashlib.sha256(canonical.encode()).hexdigest()
    signature = _signature(secret_key, day, f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{digest}")
    return {
        "Host": host,
        "x-amz-content-sha256": _EMPTY_SHA256,
        "x-amz-date": stamp,
        "Authorization": (
            f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, "
            f"SignedHeaders={_SIGNED_HEADERS}, Signature={signature}"
        ),
    }


def bucket_status(endpoint: str, bucket: str, access_key: str, secret_key: str) -> int:
    """The HTTP status of a signed HEAD of ``bucket``: 200 when it exists and the keys may
    read it, 404 when it does not exist (yet), 403 for keys the server refuses."""
    url = urlsplit(endpoint)
    host = url.netloc
    path = f"/{bucket}"
    headers = signed_headers("HEAD", host, path, access_key, secret_key, time.time())
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port or 80, timeout=2)
    try:
        conn.request("HEAD", path, headers=headers)
        return conn.getresponse().status
    finally:
        conn.close()
