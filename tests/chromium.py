"""Headless Chromium driven over the DevTools protocol on a pipe: load a page, collect what it logs, screenshot it.

``--remote-debugging-pipe`` makes Chromium read protocol commands on file
descriptor 3 and write answers and events on 4, each a JSON message ended by
a NUL byte: no port, no websocket library, nothing else to install. The
protocol reports what ``--enable-logging`` output would only hint at: every
console call (``Runtime.consoleAPICalled``), uncaught exception
(``Runtime.exceptionThrown``), browser log entry (``Log.entryAdded``: failed
loads, security errors) and every request the page makes
(``Network.requestWillBeSent``), so a test can also prove the page used no
network.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

__all__ = ["Rendered", "chromium_binary", "render"]


def chromium_binary() -> Optional[str]:
    """Debian's ``chromium`` (deploy/report/install-chromium.sh installs it), or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class Rendered:
    """What loading one page gave: its full-page screenshot and everything it reported."""

    png: bytes
    events: list[dict] = field(default_factory=list)

    def of(self, method: str) -> list[dict]:
        return [e["params"] for e in self.events if e.get("method") == method]

    @property
    def console_errors(self) -> list[str]:
        """Console errors and warnings, uncaught exceptions and browser log errors, as text."""
        found = [f"console.{p['type']}: {[a.get('value', a.get('description')) for a in p['args']]}"
                 for p in self.of("Runtime.consoleAPICalled") if p["type"] in ("error", "warning", "assert")]
        found += [f"exception: {p['exceptionDetails']}" for p in self.of("Runtime.exceptionThrown")]
        found += [f"log.{p['entry']['level']}: {p['entry']['text']}" for p in self.of("Log.entryAdded")
                  if p["entry"]["level"] in ("error", "warning")]
        return found

    @property
    def requested_urls(self) -> list[str]:
        return [p["request"]["url"] for p in self.of("Network.requestWillBeSent")]


class _Pipe:
    """The two ends of the protocol pipe and the messages read so far."""

    def __init__(self, write_fd: int, read_fd: int, timeout: float):
        self.write_fd, self.read_fd, self.timeout = write_fd, read_fd, timeout
        self.pending = b""
        self.events: list[dict] = []
        self.last_id = 0

    def send(self, method: str, params: Optional[dict] = None, session: Optional[str] = None) -> int:
        self.last_id += 1
        message = {"id": self.last_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.write_fd, json.dumps(message).encode() + b"\0")
        return self.last_id

    def call(self, method: str, params: Optional[dict] = None, session: Optional[str] = None) -> dict:
        """Send a command and wait for its answer's result."""
        number = self.send(method, params, session)
        answer = self.wait_for(lambda m: m.get("id") == number)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer.get("result", {})

    def wait_for(self, wanted: Callable[[dict], bool]) -> dict:
        deadline = time.monotonic() + self.timeout
        while True:
            while b"\0" in self.pending:
                raw, self.pending = self.pending.split(b"\0", 1)
                message = json.loads(raw)
                if "method" in message:
                    self.events.append(message)
                if wanted(message):
                    return message
            ready, _, _ = select.select([self.read_fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError(f"Chromium did not answer within {self.timeout} s")
            chunk = os.read(self.read_fd, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed the protocol pipe")
            self.pending += chunk


def _above_protocol_fds(fd: int) -> int:
    """The same pipe end on a descriptor of 10 or more, not inherited: moving the ends to 3 and 4 clobbers neither."""
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


def render(url: str, width: int = 1200, height: int = 900, timeout: float = 60.0) -> Rendered:
    """Load ``url`` in a fresh headless Chromium, wait for its load event, screenshot the whole page."""
    binary = chromium_binary()
    if binary is None:
        raise RuntimeError("no chromium: run deploy/report/install-chromium.sh")
    to_browser_read, to_browser_write = map(_above_protocol_fds, os.pipe())
    from_browser_read, from_browser_write = map(_above_protocol_fds, os.pipe())
    profile = tempfile.mkdtemp(prefix="streamdedup-chromium-")

    def wire_pipes():  # in the child, before exec: the protocol's fixed descriptors (inheritable, unlike the rest)
        os.dup2(to_browser_read, 3)
        os.dup2(from_browser_write, 4)

    command = [binary, "--headless", "--remote-debugging-pipe", "--no-sandbox",
               "--disable-gpu", "--no-first-run", "--disable-extensions", f"--user-data-dir={profile}", "about:blank"]
    process = subprocess.Popen(command, close_fds=False, preexec_fn=wire_pipes,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(to_browser_read)
    os.close(from_browser_write)
    pipe = _Pipe(to_browser_write, from_browser_read, timeout)
    try:
        target = pipe.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = pipe.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page", "Network"):
            pipe.call(f"{domain}.enable", session=session)
        pipe.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session)
        pipe.call("Page.navigate", {"url": url}, session)
        pipe.wait_for(lambda m: m.get("method") == "Page.loadEventFired")
        shot = pipe.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session)
        pipe.send("Browser.close")
        process.wait(timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(to_browser_write)
        os.close(from_browser_read)
        shutil.rmtree(profile, ignore_errors=True)
    return Rendered(base64.b64decode(shot["data"]), pipe.events)
