"""The catalogue's tables (SQLAlchemy 2 declarative). The schema itself is created by the alembic
migrations beside this file; these classes must describe the same thing.

A block is known by its hash alone: its token ids, which nodes still send, are not stored (the
catalogue never needs them, and they are users' prompts and completions). Its ``checksum`` (an
unsigned xxh3-64) is stored as the signed 64-bit integer with the same bits, since SQL has no
unsigned type.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Float, Index, LargeBinary, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Node(Base):
    """A node that registered blocks or sent a heartbeat. ``needs_resync``: the catalogue does
    not hold the node's current content, until the node registers with ``replace``."""

    __tablename__ = "nodes"

    node_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    role: Mapped[str] = mapped_column(String(64), default="")
    epoch: Mapped[str] = mapped_column(String(255), default="")
    last_seen: Mapped[float] = mapped_column(Float)
    needs_resync: Mapped[bool] = mapped_column(Boolean, default=True)
    tiers: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)


class Block(Base):
    """One KV block, present while at least one replica of it exists."""

    __tablename__ = "blocks"

    hash: Mapped[bytes] = mapped_column(LargeBinary(16), primary_key=True)
    parent_hash: Mapped[bytes] = mapped_column(LargeBinary(16))
    num_bytes: Mapped[int] = mapped_column(BigInteger)
    checksum: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[float] = mapped_column(Float)
    last_access: Mapped[float] = mapped_column(Float)
    access_count: Mapped[int] = mapped_column(BigInteger, default=0)


class Replica(Base):
    """``node_id`` holds ``block_hash`` in ``tier``.

    No foreign keys, on purpose: checking them doubled the cost of bulk registers on Postgres.
    The repository keeps the references whole instead: one writer, which inserts the node and
    block rows before their replicas in the same transaction, and deletes a block with its last
    replica and a node's replicas before the node."""

    __tablename__ = "replicas"
    __table_args__ = (Index("ix_replicas_node_id", "node_id"),)

    block_hash: Mapped[bytes] = mapped_column(LargeBinary(16), primary_key=True)
    node_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    tier: Mapped[str] = mapped_column(String(16), primary_key=True)


class Keep(Base):
    """A block kept for a tenant (``quota_key``): until ``until`` (unix time), or for good
    while ``pinned``. A keep may name a block no node holds yet (its request is still being
    computed) or any longer; what holds it keeps it while the row is in force."""

    __tablename__ = "keeps"
    __table_args__ = (Index("ix_keeps_quota_key", "quota_key"),)

    hash: Mapped[bytes] = mapped_column(LargeBinary(16), primary_key=True)
    quota_key: Mapped[bytes] = mapped_column(LargeBinary(64))
    until: Mapped[float] = mapped_column(Float)
    pinned: Mapped[bool] = mapped_column(Boolean, default=False)


nodes_table = Node.__table__
blocks_table = Block.__table__
replicas_table = Replica.__table__
keeps_table = Keep.__table__
