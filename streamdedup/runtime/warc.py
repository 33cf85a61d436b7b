"""WARC files (``.warc``, ``.warc.gz``) as input of ``streamdedup dedup``, read with FastWARC.

Each ``response`` record is one input record: its ``WARC-Target-URI`` is
the page's id and URL, its HTTP payload the page (``core.html`` extracts
the main content). Other record types (``request``, ``metadata``,
``warcinfo``, ``revisit``, ...) are skipped and not counted. A response is
rejected, with a reason, when its HTTP status is not 2xx (``http_error``),
its payload is neither HTML nor text (``not_html``), its bytes decode in no
encoding (``not_decodable``) or it cannot be read (``bad_warc_record``; a
truncated file ends its input there). Records are handed on as JSON lines
``{"id", "url", "html"}`` (or ``{"id", "rejected"}``), one per response, so
that batches, positions (a record's number counts as its line) and the
clean output (those lines of the kept pages) work as for JSONL input.
"""

from __future__ import annotations

from typing import BinaryIO, Iterator

import orjson

from ..errors import ConfigError

__all__ = ["is_warc", "warc_lines"]

_PAGE_TYPES = ("text/html", "application/xhtml+xml", "text/plain")


def is_warc(path: str) -> bool:
    return path.endswith((".warc", ".warc.gz"))


def warc_lines(handle: BinaryIO) -> Iterator[bytes]:
    """One JSON line (without newline) per response record of the WARC file open in ``handle``."""
    try:
        from fastwarc.warc import ArchiveIterator, WarcRecordType
    except ImportError:
        raise ConfigError("WARC input needs FastWARC and Resiliparse: pip install 'streamdedup[html]'") from None

    records = ArchiveIterator(handle, record_types=WarcRecordType.response, parse_http=True)
    number = 0
    while True:
        number += 1
        try:
            record = next(records)
        except StopIteration:
            return
        except Exception as exc:  # FastWARC raises its own types for damaged input
            yield _rejected(f"record-{number}", f"bad_warc_record: {exc}"[:300])
            return
        yield _line(record, number)


def _line(record, number: int) -> bytes:
    from ..core.html import html_text

    url = record.headers.get("WARC-Target-URI") or record.record_id or f"record-{number}"
    try:
        status = record.http_headers.status_code if record.http_headers is not None else None
        content_type = (record.http_content_type or "").lower()
        payload = record.reader.read()
    except Exception as exc:
        return _rejected(url, f"bad_warc_record: {exc}"[:300])
    if status is None:
        return _rejected(url, "bad_warc_record: the record holds no HTTP response")
    if not 200 <= status < 300:
        return _rejected(url, f"http_error: HTTP status {status}")
    if content_type and not content_type.startswith(_PAGE_TYPES):
        return _rejected(url, f"not_html: payload is {content_type}")
    markup = html_text(payload)
    if markup is None:
        return _rejected(url, "not_decodable: no encoding reads the payload")
    return orjson.dumps({"id": url, "url": url, "html": markup})


def _rejected(url: str, why: str) -> bytes:
    return orjson.dumps({"id": url, "rejected": why})
