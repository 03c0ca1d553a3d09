"""
A static HTTP file server on 127.0.0.1 for download tests and the pages of browser tests (stdlib `http.server` in a
thread), and a closed port.

`FileServer(files)` serves `files` (URL path -> bytes) with a `Content-Length` (as HTML for a path ending `.html`, else
as JSON), answers 404 for any other path, and records the path of every GET request in `requests`, so a test can tell
a cached file from a downloaded one.

### Usage
```python
with FileServer({"/data/dev.json": b"{}"}) as server:
    download(server.url("/data/dev.json"), cache_dir=tmp_path)
    assert server.requests == ["/data/dev.json"]
```
"""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FileServer:
    """Serves fixed files over HTTP on 127.0.0.1 at a free port, in a daemon thread, while the `with` block runs."""

    def __init__(self, files: dict[str, bytes]) -> None:
        """:param files: The URL paths (starting with `/`) and the bytes each one serves."""
        self.files = files
        self.requests: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests.append(self.path)
                body = server.files.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                html = self.path.endswith(".html")
                self.send_header("Content-Type", "text/html; charset=utf-8" if html else "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # keep the test output clean
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def url(self, path: str) -> str:
        """The `http://127.0.0.1:<port><path>` URL of a served path."""
        return f"http://127.0.0.1:{self._httpd.server_address[1]}{path}"

    def __enter__(self) -> FileServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()


def closed_port_url(path: str = "/dev-v2.0.json") -> str:
    """
    An http URL on 127.0.0.1 at a port nothing listens on (one the system just handed out and took back), where a
    connection is refused at once: the offline case, without waiting for a timeout.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}{path}"
