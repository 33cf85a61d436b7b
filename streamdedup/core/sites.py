"""Which site a page belongs to: the host of its URL, as a stable 64-bit key.

A site is where a template is learned (``engine.templates``). The host is
taken from the URL (scheme optional), lower-cased, without port, trailing
dot or a leading ``www.``; ``news.example.com`` and ``example.com`` are two
sites. Pages without a URL share the site key 0.
"""

from __future__ import annotations

import hashlib
from typing import Optional
from urllib.parse import urlsplit

__all__ = ["NO_SITE", "site_host", "site_key"]

NO_SITE = 0


def site_host(url: Optional[str]) -> str:
    """The host that names the site of ``url`` ("" when there is none)."""
    if not url:
        return ""
    text = url.strip()
    if "//" not in text:
        text = "//" + text
    try:
        host = urlsplit(text).hostname or ""
    except ValueError:  # a malformed port or bracket: the page simply has no site
        return ""
    host = host.rstrip(".")
    return host[4:] if host.startswith("www.") else host


def site_key(url: Optional[str]) -> int:
    """BLAKE2b-64 of the site's host (never 0), or ``NO_SITE`` for a page without one."""
    host = site_host(url)
    if not host:
        return NO_SITE
    return int.from_bytes(hashlib.blake2b(host.encode("utf-8"), digest_size=8).digest(), "big") or 1
