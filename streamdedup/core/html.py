"""HTML pages -> their main content, with Resiliparse (the extractor of the ChatNoir web search project).

Chosen over trafilatura on speed, measured in ``bench/html_input.py`` on the web
crawl sample served as HTML: Resiliparse extracts about 6 times as many
pages a second as trafilatura's fast mode (and 20 times its default mode),
and recovers every page's body, with more of the template left in (sidebars,
boxes); the site templates learned downstream (``core.templates``) take
that out. The import is deferred: only HTML and WARC input need it.
"""

from __future__ import annotations

import functools
from typing import Optional, Union

from ..errors import ConfigError

__all__ = ["main_text", "html_text"]


def html_text(page: Union[bytes, str]) -> Optional[str]:
    """The page's markup as text: bytes decoded by their declared or detected encoding (None: undecodable)."""
    if isinstance(page, str):
        return page
    _require_resiliparse()
    from resiliparse.parse.encoding import bytes_to_str, detect_encoding

    try:
        return bytes_to_str(page, detect_encoding(page))
    except (UnicodeDecodeError, LookupError):
        return None


def main_text(markup: str) -> str:
    """The main content of an HTML page as plain text ("" when it has none)."""
    _require_resiliparse()
    from resiliparse.extract.html2text import extract_plain_text

    return extract_plain_text(markup, main_content=True, alt_texts=False, noscript=False) or ""


@functools.cache
def _require_resiliparse() -> None:
    try:
        import resiliparse  # noqa: F401
    except ImportError:
        raise ConfigError("HTML and WARC input need Resiliparse and FastWARC: pip install 'streamdedup[html]'") from None
