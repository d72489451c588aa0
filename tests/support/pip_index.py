"""A local stand-in for a package index that answers one project page (for probes of it)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def index_answering(page: str) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 whose ``page`` (a path such as ``/whl/cpu/torch/``) answers
    200, every other path 404; yields its base URL."""

    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == page else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
