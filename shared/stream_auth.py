"""Per-request keys that bind a client's stream to the nodes serving it.

Every node may publish on ``crescent.tokens.*`` (a node cannot know in advance which requests
it will serve), so the subject alone proves nothing about who wrote a chunk. The gateway
therefore gives each request a fresh random ``stream_key``; it travels inside the request to
the scheduler, the prefill node and the decode node it is handed to (subjects only that node
may read), and nowhere else. Each ``TokenChunk`` and ``AbortRequest`` carries a tag: keyed
BLAKE2b over the fields that decide what the client sees. The gateway drops chunks whose tag
does not verify, and a node ignores an abort of a request it serves unless it is tagged with
that request's key: another node, even with valid NATS credentials, can neither write into
nor end a stream it was not given.

A request with no key (built by hand in a test, or by a gateway older than the field) is
neither signed nor checked.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

import msgspec

from shared.messages import AbortRequest, TokenChunk

KEY_BYTES = 16
TAG_BYTES = 16
_CHUNK = b"crescent-chunk"
_ABORT = b"crescent-abort"
_encode = msgspec.json.Encoder().encode


def new_stream_key() -> bytes:
    """A fresh key for one request's stream."""
    return secrets.token_bytes(KEY_BYTES)


def _tag(key: bytes, person: bytes, fields: object) -> bytes:
    return hashlib.blake2b(_encode(fields), key=key, digest_size=TAG_BYTES, person=person).digest()


def _chunk_fields(chunk: TokenChunk, request_id: str) -> tuple[object, ...]:
    # Every field a client's answer depends on; ``phases`` (timings for /debug) is left out.
    return (
        request_id,
        chunk.index,
        chunk.token_ids,
        chunk.logprobs,
        chunk.finish_reason,
        chunk.num_prompt_tokens,
        chunk.num_cached_tokens,
        chunk.error,
        chunk.error_code,
        chunk.retry_after_s,
        chunk.node_id,
        chunk.epoch,
        chunk.owner,
        chunk.owner_epoch,
        chunk.migrate,
        chunk.cached_by_tier,
        chunk.prompt_tokens_written,
        chunk.output_tokens_written,
    )


def seal_chunk(chunk: TokenChunk, key: bytes) -> None:
    """Tags ``chunk`` with ``key`` (nothing without a key). Call it last: any later change
    to the chunk makes the tag fail."""
    chunk.mac = _tag(key, _CHUNK, _chunk_fields(chunk, chunk.request_id)) if key else b""


def chunk_is_authentic(chunk: TokenChunk, request_id: str, key: bytes) -> bool:
    """Whether ``chunk`` was tagged for ``request_id`` (the id its subject names) by a holder
    of ``key``. Always true without a key."""
    if not key:
        return True
    expected = _tag(key, _CHUNK, _chunk_fields(chunk, request_id))
    return hmac.compare_digest(expected, chunk.mac)


def seal_abort(abort: AbortRequest, key: bytes) -> AbortRequest:
    """``abort`` tagged with its request's key (unchanged without one)."""
    abort.mac = _tag(key, _ABORT, (abort.request_id, abort.only_node)) if key else b""
    return abort


def abort_is_authentic(abort: AbortRequest, key: bytes) -> bool:
    """Whether ``abort`` comes from a holder of its request's ``key``; true without a key."""
    if not key:
        return True
    expected = _tag(key, _ABORT, (abort.request_id, abort.only_node))
    return hmac.compare_digest(expected, abort.mac)
