"""Regenerates the gRPC stubs of ``cachemeta.proto``: ``python -m shared.rpc.generate``.

protoc writes an absolute ``import cachemeta_pb2``; the stubs live in a package, so that line is
rewritten into a package import. Each file gets a header that keeps linters and type checkers off
generated code. A test regenerates into a temporary folder and compares with the committed files.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

RPC_DIR = Path(__file__).resolve().parent
PROTO = "cachemeta.proto"
STUBS = ("cachemeta_pb2.py", "cachemeta_pb2.pyi", "cachemeta_pb2_grpc.py")
_HEADER = {
    ".py": "# ruff: noqa\n# fmt: off\n# mypy: ignore-errors\n",
    ".pyi": "# ruff: noqa\n# fmt: off\n",
}
_ABSOLUTE_IMPORT = "import cachemeta_pb2 as cachemeta__pb2"
_PACKAGE_IMPORT = "from shared.rpc import cachemeta_pb2 as cachemeta__pb2"


def generate(out_dir: Path) -> list[Path]:
    """Writes the three stub files into ``out_dir`` and returns their paths."""
    from grpc_tools import protoc  # grpcio-tools is a test/dev dependency only

    with tempfile.TemporaryDirectory() as raw:
        args = [
            "grpc_tools.protoc",
            f"-I{RPC_DIR}",
            f"--python_out={raw}",
            f"--pyi_out={raw}",
            f"--grpc_python_out={raw}",
            str(RPC_DIR / PROTO),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {RPC_DIR / PROTO}")
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for name in STUBS:
            text = (Path(raw) / name).read_text()
            if name.endswith("_grpc.py"):
                if _ABSOLUTE_IMPORT not in text:
                    raise RuntimeError(f"{name}: protoc no longer writes {_ABSOLUTE_IMPORT!r}")
                text = text.replace(_ABSOLUTE_IMPORT, _PACKAGE_IMPORT)
            path = out_dir / name
            path.write_text(_HEADER[path.suffix] + text)
            written.append(path)
    return written


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else RPC_DIR
    for path in generate(out):
        print(path)


if __name__ == "__main__":
    main()
