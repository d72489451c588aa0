"""The committed gRPC stubs are exactly what the generator makes from the committed .proto."""

from __future__ import annotations

from pathlib import Path

from shared.rpc import generate


def test_committed_stubs_match_the_proto(tmp_path: Path) -> None:
    written = generate.generate(tmp_path)
    assert sorted(p.name for p in written) == sorted(generate.STUBS)
    for path in written:
        committed = generate.RPC_DIR / path.name
        assert committed.read_text() == path.read_text(), (
            f"{committed} is stale: run `make stubs` (python -m shared.rpc.generate)"
        )


def test_stubs_use_package_imports() -> None:
    grpc_stub = (generate.RPC_DIR / "cachemeta_pb2_grpc.py").read_text()
    assert "from shared.rpc import cachemeta_pb2" in grpc_stub
    assert "\nimport cachemeta_pb2" not in grpc_stub
