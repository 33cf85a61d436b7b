"""Prometheus metrics without dependencies: a registry and a small HTTP server.

Design: each metric (``Counter``, ``Gauge``, ``Histogram``) keeps its samples in a
dict keyed by the tuple of label values, guarded by its own lock. The worker thread
updates metrics; ``Registry.exposition()`` (run by the server thread on each scrape)
copies each metric's samples under that lock, so a scrape sees a consistent snapshot
per metric, then renders Prometheus text format 0.0.4 outside the lock.
``MetricsServer`` serves ``/metrics``, ``/healthz`` and ``/readyz`` from a
``ThreadingHTTPServer`` running in a daemon thread; ``stop()`` closes the socket.
"""

from __future__ import annotations

import bisect
import errno
import math
import re
import socket
import socketserver
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Iterable, Iterator, Sequence, TypeVar, Union

__all__ = ["Registry", "Counter", "Gauge", "Histogram", "MetricsServer", "parse_address",
           "CONTENT_TYPE", "DEFAULT_BUCKETS"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10)
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
Probe = Callable[[], Union[bool, tuple[bool, str]]]
_Pairs = Sequence[tuple[str, str]]
_M = TypeVar("_M", bound="_Metric")


def _format_value(value: float) -> str:
    """A float as Prometheus (Go's ParseFloat) reads it: ``1``, ``0.25``, ``+Inf``, ``NaN``."""
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 2 ** 53:
        return str(int(value))
    return repr(value)


def _escape(text: str, quote: bool) -> str:
    text = text.replace("\\", "\\\\").replace("\n", "\\n")
    return text.replace('"', '\\"') if quote else text


def _sample_line(name: str, pairs: _Pairs, value: float) -> str:
    labels = ",".join(f'{key}="{_escape(val, True)}"' for key, val in pairs)
    return f"{name}{{{labels}}} {_format_value(value)}\n" if labels else f"{name} {_format_value(value)}\n"


def _check_labels(name: str, labels: Iterable[str], reserved: tuple[str, ...]) -> tuple[str, ...]:
    if isinstance(labels, str):
        raise ValueError(f"labels of metric {name!r} must be a tuple of names, e.g. ({labels!r},)")
    labels = tuple(labels)
    for label in labels:
        if not _LABEL_NAME.fullmatch(label) or label.startswith("__") or label in reserved:
            raise ValueError(f"label name {label!r} of metric {name!r} is invalid: expected "
                             f"[a-zA-Z_][a-zA-Z0-9_]*, not starting with '__', not one of {reserved}")
    if len(set(labels)) != len(labels):
        raise ValueError(f"metric {name!r} lists a label name twice: {labels}")
    return labels


class _Metric:
    kind = "untyped"
    _reserved: tuple[str, ...] = ()

    def __init__(self, name: str, documentation: str, labels: Iterable[str] = ()):
        if not _METRIC_NAME.fullmatch(name):
            raise ValueError(f"metric name {name!r} is invalid: expected [a-zA-Z_:][a-zA-Z0-9_:]*")
        self.name = name
        self.documentation = documentation
        self.labelnames = _check_labels(name, labels, self._reserved)
        self._lock = threading.Lock()
        self._values: dict[tuple[str, ...], object] = {}
        if not self.labelnames:
            self._values[()] = self._zero()

    def _zero(self) -> object:
        return 0.0

    def _copy(self, value: object) -> object:
        return value

    def _key(self, labels: dict) -> tuple[str, ...]:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"metric {self.name!r} expects labels ({', '.join(self.labelnames)}), "
                             f"got ({', '.join(sorted(labels))})")
        return tuple(str(labels[label]) for label in self.labelnames)

    def _snapshot(self) -> list[tuple[tuple[str, ...], object]]:
        with self._lock:
            items = [(key, self._copy(value)) for key, value in self._values.items()]
        return sorted(items, key=lambda item: item[0])

    def _samples(self) -> Iterator[tuple[str, _Pairs, float]]:
        for key, value in self._snapshot():
            yield self.name, tuple(zip(self.labelnames, key)), value

    def sample_names(self) -> set[str]:
        """The sample names this metric writes (used to refuse clashing registrations)."""
        return {self.name}

    def render(self) -> str:
        """This metric family in text format 0.0.4: HELP, TYPE and one line per sample."""
        head = f"# HELP {self.name} {_escape(self.documentation, False)}\n# TYPE {self.name} {self.kind}\n"
        return head + "".join(_sample_line(*sample) for sample in self._samples())

    def _add(self, amount: float, labels: dict) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + float(amount)

    def value(self, **labels: object) -> object:
        """The current value for these labels (0 / empty when never updated)."""
        key = self._key(labels)
        with self._lock:
            return self._copy(self._values.get(key, self._zero()))


class Counter(_Metric):
    """A monotonically increasing count; the name must end in ``_total``."""

    kind = "counter"

    def __init__(self, name: str, documentation: str, labels: Iterable[str] = ()):
        if not name.endswith("_total"):
            raise ValueError(f"counter name {name!r} must end in '_total' (e.g. {name}_total)")
        super().__init__(name, documentation, labels)

    def inc(self, amount: float = 1, /, **labels: object) -> None:
        if not amount >= 0:
            raise ValueError(f"counter {self.name!r} can only go up: inc({amount!r}) is not allowed")
        self._add(amount, labels)


class Gauge(_Metric):
    """A value that goes up and down, set directly or computed at scrape time."""

    kind = "gauge"
    _function: Callable[[], float] | None = None

    def set(self, value: float, /, **labels: object) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = float(value)

    def inc(self, amount: float = 1, /, **labels: object) -> None:
        self._add(amount, labels)

    def dec(self, amount: float = 1, /, **labels: object) -> None:
        self._add(-amount, labels)

    def remove(self, **labels: object) -> None:
        """Forget the sample for these labels (e.g. a partition no longer assigned)."""
        key = self._key(labels)
        with self._lock:
            self._values.pop(key, None)

    def set_function(self, function: Callable[[], float] | None) -> None:
        """Compute the value at each scrape (unlabelled gauges only); ``None`` goes back to set()."""
        if self.labelnames:
            raise ValueError(f"set_function needs a gauge without labels; {self.name!r} has "
                             f"labels ({', '.join(self.labelnames)})")
        with self._lock:
            self._function = function

    def _snapshot(self) -> list[tuple[tuple[str, ...], object]]:
        function = self._function
        if function is None:
            return super()._snapshot()
        try:
            return [((), float(function()))]
        except Exception:  # a broken callback must not break the scrape: skip the sample
            return []


class Histogram(_Metric):
    """Observations counted into cumulative ``le`` buckets, with ``_sum`` and ``_count``."""

    kind = "histogram"
    _reserved = ("le",)

    def __init__(self, name: str, documentation: str, labels: Iterable[str] = (),
                 buckets: Iterable[float] = DEFAULT_BUCKETS):
        bounds = [float(bound) for bound in buckets]
        if bounds and bounds[-1] == math.inf:
            bounds.pop()
        if not bounds or any(math.isnan(b) or math.isinf(b) for b in bounds) or \
                any(a >= b for a, b in zip(bounds, bounds[1:])):
            raise ValueError(f"buckets of histogram {name!r} must be finite and strictly increasing, "
                             f"got {tuple(buckets)}")
        self.bounds = tuple(bounds)
        super().__init__(name, documentation, labels)

    def _zero(self) -> list:
        return [[0] * (len(self.bounds) + 1), 0.0, 0]  # per-bucket counts (last is +Inf), sum, count

    def _copy(self, value: list) -> list:
        return [list(value[0]), value[1], value[2]]

    def observe(self, value: float, /, **labels: object) -> None:
        value = float(value)
        key = self._key(labels)
        index = len(self.bounds) if math.isnan(value) else bisect.bisect_left(self.bounds, value)
        with self._lock:
            state = self._values.get(key)
            if state is None:
                state = self._values[key] = self._zero()
            state[0][index] += 1
            state[1] += value
            state[2] += 1

    def sample_names(self) -> set[str]:
        return {self.name, f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count"}

    def _samples(self) -> Iterator[tuple[str, _Pairs, float]]:
        for key, (counts, total, count) in self._snapshot():
            pairs = tuple(zip(self.labelnames, key))
            cumulative = 0
            for bound, bucket in zip((*self.bounds, math.inf), counts):
                cumulative += bucket
                yield f"{self.name}_bucket", (*pairs, ("le", _format_value(bound))), cumulative
            yield f"{self.name}_sum", pairs, total
            yield f"{self.name}_count", pairs, count


class Registry:
    """The set of metrics one process exposes; create metrics through it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._metrics: dict[str, _Metric] = {}
        self._claimed: set[str] = set()

    def counter(self, name: str, documentation: str, labels: Iterable[str] = ()) -> Counter:
        return self._register(Counter(name, documentation, labels))

    def gauge(self, name: str, documentation: str, labels: Iterable[str] = ()) -> Gauge:
        return self._register(Gauge(name, documentation, labels))

    def histogram(self, name: str, documentation: str, labels: Iterable[str] = (),
                  buckets: Iterable[float] = DEFAULT_BUCKETS) -> Histogram:
        return self._register(Histogram(name, documentation, labels, buckets))

    def _register(self, metric: _M) -> _M:
        names = metric.sample_names()
        with self._lock:
            if names & self._claimed:
                raise ValueError(f"metric {metric.name!r} is already registered (or clashes with the "
                                 f"samples of one): {', '.join(sorted(names & self._claimed))}")
            self._claimed |= names
            self._metrics[metric.name] = metric
        return metric

    def exposition(self) -> str:
        """All metrics in Prometheus text exposition format 0.0.4."""
        with self._lock:
            metrics = list(self._metrics.values())
        return "".join(metric.render() for metric in metrics)


def parse_address(address: str) -> tuple[str, int]:
    """``"host:port"`` or ``"[ipv6]:port"`` -> (host, port); ValueError names the expected form."""
    match = re.fullmatch(r"\[([^\[\]\s]+)\]:(\d{1,5})|([^:\[\]\s]*):(\d{1,5})", address.strip())
    port = int(match.group(2) or match.group(4)) if match else -1
    if not 0 <= port <= 65535:
        raise ValueError(f"metrics address {address!r} is not of the form host:port "
                         f"(e.g. 127.0.0.1:9464, 0.0.0.0:9464 or [::1]:9464; port 0 picks a free port)")
    return (match.group(1) or match.group(3)), port


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def server_bind(self) -> None:  # skip HTTPServer's socket.getfqdn(): it may wait on DNS
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # e.g. the client hung up: no traceback on stderr


class _Server6(_Server):
    address_family = socket.AF_INET6


def _probe(check: Probe | None) -> tuple[int, str]:
    if check is None:
        return 200, "ok"
    try:
        result = check()
        ok, message = result if isinstance(result, tuple) else (bool(result), "ok" if result else "not ok")
    except Exception as exc:
        return 503, f"{type(exc).__name__}: {exc}"
    return (200 if ok else 503), str(message)


class _Handler(BaseHTTPRequestHandler):
    server_version = "streamdedup-metrics"

    def do_GET(self) -> None:
        owner: MetricsServer = self.server.owner  # type: ignore[attr-defined]
        path, content_type = self.path.split("?", 1)[0], "text/plain; charset=utf-8"
        if path == "/metrics":
            try:
                status, body, content_type = 200, owner.registry.exposition(), CONTENT_TYPE
            except Exception as exc:
                status, body = 500, f"{type(exc).__name__}: {exc}\n"
        elif path in ("/healthz", "/readyz"):
            status, message = _probe(owner.healthy if path == "/healthz" else owner.ready)
            body = message + "\n"
        else:
            status, body = 404, "not found: try /metrics, /healthz or /readyz\n"
        data = body.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:  # no request log on stderr
        pass


class MetricsServer:
    """Serves /metrics, /healthz and /readyz on ``address`` from a daemon thread."""

    def __init__(self, registry: Registry, address: str = "127.0.0.1:9464", *,
                 ready: Probe | None = None, healthy: Probe | None = None):
        self.registry, self.address, self.ready, self.healthy = registry, address, ready, healthy
        self.host, self._port = parse_address(address)
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (the one picked by the system when the address says port 0)."""
        return self._httpd.server_address[1] if self._httpd else self._port

    def start(self) -> None:
        if self._httpd is not None:
            raise RuntimeError(f"metrics server on {self.address} is already started")
        server_class = _Server6 if ":" in self.host else _Server
        try:
            httpd = server_class((self.host, self._port), _Handler)
        except OSError as exc:
            where = f"cannot serve metrics on {self.address}"
            if exc.errno == errno.EADDRINUSE:
                raise OSError(exc.errno, f"{where}: the port is already in use by another process; "
                                         f"stop it or choose another metrics address") from exc
            raise OSError(exc.errno, f"{where}: {exc.strerror or exc}") from exc
        httpd.owner = self  # type: ignore[attr-defined]
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
