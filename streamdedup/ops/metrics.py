"""Metrics with ``prometheus_client``, served with ``/healthz`` and ``/readyz`` from one port.

``new_registry()`` makes a registry of our own (never the library's global
default, so several workers or engines in one process do not clash) holding the
library's standard process, platform and garbage-collector collectors; the
worker's metrics are registered in it (see ``telemetry``). Only the process
that serves the registry reports its resident memory and CPU: the feed process
of the worker updates no metric.

``MetricsServer`` serves the library's WSGI application at ``/metrics`` (text
format, OpenMetrics on request, gzip, ``name[]`` filters) and the two probes
beside it, from a daemon thread. A probe is a callable returning ``bool`` or
``(bool, message)``; an exception counts as not ok.
"""

from __future__ import annotations

import errno
import re
import socket
import threading
import socketserver
from typing import Callable, Iterable, Union
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector,
                               make_wsgi_app)

__all__ = ["new_registry", "MetricsServer", "parse_address"]

Probe = Callable[[], Union[bool, tuple[bool, str]]]
_TEXT = ("Content-Type", "text/plain; charset=utf-8")


def new_registry() -> CollectorRegistry:
    """A registry of our own with the standard ``process_*`` and ``python_*`` collectors in it."""
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def parse_address(address: str) -> tuple[str, int]:
    """``"host:port"`` or ``"[ipv6]:port"`` -> (host, port); ValueError names the expected form."""
    match = re.fullmatch(r"\[([^\[\]\s]+)\]:(\d{1,5})|([^:\[\]\s]*):(\d{1,5})", address.strip())
    port = int(match.group(2) or match.group(4)) if match else -1
    if not 0 <= port <= 65535:
        raise ValueError(f"metrics address {address!r} is not of the form host:port "
                         f"(e.g. 127.0.0.1:9464, 0.0.0.0:9464 or [::1]:9464; port 0 picks a free port)")
    return (match.group(1) or match.group(3)), port


def _probe(check: Probe | None) -> tuple[bool, str]:
    if check is None:
        return True, "ok"
    try:
        result = check()
        return result if isinstance(result, tuple) else (bool(result), "ok" if result else "not ok")
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True

    def server_bind(self) -> None:  # skip HTTPServer's socket.getfqdn(): it may wait on DNS
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]
        self.setup_environ()

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # e.g. the client hung up: no traceback on stderr


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # no request log on stderr
        pass


class MetricsServer:
    """Serves /metrics, /healthz and /readyz on ``address`` from a daemon thread."""

    def __init__(self, registry: CollectorRegistry, address: str = "127.0.0.1:9464", *,
                 ready: Probe | None = None, healthy: Probe | None = None):
        self.registry, self.address, self.ready, self.healthy = registry, address, ready, healthy
        self.host, self._port = parse_address(address)
        self._metrics_app = make_wsgi_app(registry)
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (the one picked by the system when the address says port 0)."""
        return self._httpd.server_address[1] if self._httpd else self._port

    def app(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        """The WSGI application: the library's /metrics, our two probes, 404 elsewhere."""
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return self._metrics_app(environ, start_response)
        if path in ("/healthz", "/readyz"):
            ok, message = _probe(self.healthy if path == "/healthz" else self.ready)
            start_response("200 OK" if ok else "503 Service Unavailable", [_TEXT])  # a new list: wsgiref adds to it
            return [f"{message}\n".encode("utf-8")]
        start_response("404 Not Found", [_TEXT])
        return [b"not found: try /metrics, /healthz or /readyz\n"]

    def start(self) -> None:
        if self._httpd is not None:
            raise RuntimeError(f"metrics server on {self.address} is already started")
        server_class = _Server6 if ":" in self.host else _Server
        try:
            httpd = make_server(self.host, self._port, self.app, server_class, _QuietHandler)
        except OSError as exc:
            where = f"cannot serve metrics on {self.address}"
            if exc.errno == errno.EADDRINUSE:
                raise OSError(exc.errno, f"{where}: the port is already in use by another process; "
                                         f"stop it or choose another metrics address") from exc
            raise OSError(exc.errno, f"{where}: {exc.strerror or exc}") from exc
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="streamdedup-metrics", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving, close the socket and join the thread; safe to call twice."""
        httpd, thread, self._httpd, self._thread = self._httpd, self._thread, None, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> "MetricsServer":
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
