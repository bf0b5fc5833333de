"""HTTP receivers on loopback that record what they are sent (alert tests)."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

# (status code, body) for a request body; a validator returns its complaint or None.
Answer = Callable[[Any], tuple[int, Any]]


class Receiver:
    def __init__(self, answer: Answer | None = None) -> None:
        self.requests: list[tuple[str, Any]] = []
        self.lock = threading.Lock()
        self.answer = answer or (lambda body: (200, {}))
        rec = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw
                with rec.lock:
                    rec.requests.append((self.path, body))
                code, out = rec.answer(body)
                data = out.encode() if isinstance(out, str) else json.dumps(out).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def bodies(self) -> list[Any]:
        with self.lock:
            return [b for _, b in self.requests]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
