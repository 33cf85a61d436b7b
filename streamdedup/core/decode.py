"""Input record bytes -> ``Document``, or ``Rejected`` with a reason. Never raises for bad input.

Reason codes (also the ``reason`` label of the rejected-documents metric):

=================  ==========================================================
``tombstone``      the record's value is null (a Kafka tombstone)
``too_large``      the record is above ``input.max_record_bytes``
``invalid_utf8``   JSON or plain text that is not valid UTF-8
``invalid_json``   not a JSON document (a blank line included), or nested too deeply to decode
``invalid_msgpack`` not a msgpack document
``not_an_object``  JSON or msgpack that is not an object / map
``missing_text``   the text field is absent or null
``text_not_string`` the text field holds a number, list, object, bytes, ...
``invalid_text``   the text holds lone surrogates (not encodable as UTF-8)
``text_too_large`` the text is above ``input.max_text_bytes`` (UTF-8 bytes)
``empty_text``     nothing is left of the text after normalization
``bad_id``         the id field is not a string or an integer, or is too long
``invalid_key``    the Kafka key is not UTF-8 (with ``input.binary_keys = "reject"``)
``invalid_header`` a header key is not UTF-8 (Kafka says it must be; some
                   clients write any bytes); on the dead-letter topic it is
                   ``streamdedup.binary-header-key`` / ``-value``
``unreadable_record`` the Kafka client cannot read the record (a failed
                   checksum); it has no bytes
``not_decodable``  an HTML page whose bytes no encoding reads (``input.format = "html"``)
``no_main_content`` an HTML page with no main content to extract
``not_html``       a WARC response whose payload is not HTML or text
``http_error``     a WARC response whose HTTP status is not 2xx
``bad_warc_record`` a WARC record that cannot be read (truncated, bad HTTP headers)
``too_large_for_output`` kept, the record (key, value, headers and ours) would
                   be larger than the clean topic accepts (its ``max.message.bytes``,
                   read at start); checked before deciding, so the index never
                   holds a kept document the clean topic lacks
=================  ==========================================================
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Callable, Optional

import msgpack
import orjson

from .html import html_text, main_text
from .records import Document, Item, Rejected, Source

__all__ = ["InputSpec", "decode", "decode_many", "field_at", "text_limit_for_output", "decode_object", "decode_pair", "decode_warc_line", "REASONS"]

REASONS = (
    "tombstone", "too_large", "invalid_utf8", "invalid_json", "invalid_msgpack", "not_an_object",
    "missing_text", "text_not_string", "invalid_text", "text_too_large", "empty_text", "bad_id",
    "invalid_key", "invalid_header", "unreadable_record", "too_large_for_output",
    "not_decodable", "no_main_content", "not_html", "http_error", "bad_warc_record",
)
MAX_ID_CHARS = 1024


@dataclass(frozen=True)
class InputSpec:
    """How to read documents out of record bytes (the ``[input]`` section)."""

    format: str = "json"  # "json", "msgpack", "text" or "html"
    id_field: str = "id"  # dotted path; "" means: no id field
    text_field: str = "text"  # dotted path
    url_field: str = "url"  # dotted path of the page's URL ("": none); its host names the page's site
    max_record_bytes: int = 8 << 20  # 8 MiB
    max_text_bytes: int = 1 << 20  # 1 MiB of UTF-8
    binary_keys: str = "reject"  # "reject" or "ignore" a Kafka key that is not UTF-8
    max_output_bytes: int = 0  # the clean topic's max.message.bytes, set by the worker at start (0: no limit)
    kept_bytes: Optional[Callable[..., int]] = None  # with it: a document's record size on the clean topic, kept
    html_field: str = ""  # dotted path of a page's HTML in an object: its main content is the text ("": none)
    main_content: bool = True  # False: an HTML page's document carries its id alone, nothing extracted (``placing``)

    def __post_init__(self) -> None:
        if self.max_output_bytes and self.kept_bytes is None:
            raise ValueError("InputSpec: max_output_bytes needs kept_bytes, the measure of a kept record")

    @classmethod
    def from_section(cls, section) -> "InputSpec":
        """The spec of a config ``[input]`` section."""
        return cls(section.format, section.id_field, section.text_field, section.url_field,
                   section.max_record_bytes, section.max_text_bytes, section.binary_keys, html_field=section.html_field)

    def placing(self) -> "InputSpec":
        """The spec that finds each record's id and nothing more: an HTML page's main content is not extracted
        nor a kept record measured, whose rejections carry the id the record has anyway (the sharded signer
        places records by id; their homes decode them with the whole spec)."""
        return replace(self, main_content=False, max_output_bytes=0, kept_bytes=None)


RECORD_ROOM = 16 << 10  # what a kept record carries besides its text: JSON framing, id, key, headers (ours too)


def text_limit_for_output(max_text_bytes: int, output_limit: int) -> int:
    """The text limit the worker applies: ``input.max_text_bytes``, lowered where the clean topic takes
    smaller records (``output_limit``: its ``max.message.bytes``, 0: none) with room for the rest of one.

    With both defaults (1 MiB of text, Kafka's 1,048,588-byte messages) a kept
    text near the limit would be too large to forward: such texts are
    rejected as ``text_too_large`` before anything is decided, the limit says
    so in the log at start, and a kept text below it fits unless its record
    carries unusually large headers or escapes (``too_large_for_output``).
    """
    if not output_limit:
        return max_text_bytes
    return max(1, min(max_text_bytes, output_limit - RECORD_ROOM))


def decode(value: Optional[bytes], source: Source, spec: InputSpec, key: Optional[bytes] = None,
           headers: tuple = (), rejected: Optional[str] = None) -> Item:
    """The document in ``value``, or why there is none (``rejected``: "reason: detail" found as it was read)."""
    if rejected is not None:
        reason, _, detail = rejected.partition(": ")
        return Rejected(reason, detail, source)
    item = _decoded(value, source, spec, key)
    if spec.max_output_bytes and isinstance(item, Document):
        return _fits_output(item, value, key, headers, spec)
    return item


def decode_many(values: list, sources: list, spec: InputSpec, keys: Optional[list] = None,
                headers: Optional[list] = None, rejected: Optional[list] = None) -> list[Item]:
    """``decode`` of each record (``keys``, ``headers``, ``rejected``: None for all, or one per record).

    The common record (a JSON object read by ``orjson`` with a nonblank ASCII
    text string under the size limits, a nonempty ASCII string or integer id,
    no key or an ASCII one (the id is the id field's), nothing rejected) is taken on a short path that makes the very
    Document ``decode`` makes; every other record goes through ``decode``
    (tested against it on records of every kind).
    """
    count = len(values)
    keys = keys if keys is not None else [None] * count
    headers = headers if headers is not None else [()] * count
    rejected = rejected if rejected is not None else [None] * count
    if spec.format != "json" or spec.html_field or not spec.id_field or "." in spec.id_field + spec.text_field + spec.url_field:
        return [decode(v, s, spec, k, h, r) for v, s, k, h, r in zip(values, sources, keys, headers, rejected)]
    loads, JSONDecodeError = orjson.loads, orjson.JSONDecodeError
    id_field, text_field, url_field = spec.id_field, spec.text_field, spec.url_field
    max_record, max_text, limited = spec.max_record_bytes, spec.max_text_bytes, spec.max_output_bytes
    items: list[Item] = []
    append = items.append
    for value, source, key, header, refused in zip(values, sources, keys, headers, rejected):
        if (key is None or key.isascii()) and refused is None and value is not None and len(value) <= max_record:
            try:
                fields = loads(value)
            except JSONDecodeError:
                fields = None
            if type(fields) is dict:
                text, raw = fields.get(text_field), fields.get(id_field)
                if (type(text) is str and text.isascii() and 0 < len(text) <= max_text and not text.isspace()
                        and ((type(raw) is str and raw and raw.isascii() and len(raw) <= MAX_ID_CHARS)
                             or type(raw) is int)):
                    doc = Document(raw if type(raw) is str else str(raw), text, source)
                    if url_field:
                        url = fields.get(url_field)
                        if type(url) is str and url:
                            doc.url = url
                    append(_fits_output(doc, value, key, header, spec) if limited else doc)
                    continue
        append(decode(value, source, spec, key, header, refused))
    return items


def decode_object(fields: Any, source: Source, spec: InputSpec) -> Item:
    """The document in an already parsed record (a dict, as the Python API receives it), or why there is none.

    The same rules as a JSON line (``spec.id_field``, ``text_field`` and
    ``url_field`` are dotted paths), but the id is required: a position in
    one call names nothing the next call could recognize.
    """
    if not isinstance(fields, dict):
        return Rejected("not_an_object", f"a record is a dict or an (id, text) pair, not a {type(fields).__name__}",
                        source)
    doc_id, id_problem = _document_id(fields, spec, None)
    if id_problem:
        return problem_at(id_problem, source)
    if doc_id is None:
        return Rejected("bad_id", f"no id at {spec.id_field!r}: give every document a string or integer id", source)
    page = _html_of(fields, doc_id, source, spec)
    if page is not None:
        return page
    item = _checked_text(field_at(fields, spec.text_field), doc_id, source, spec)
    if spec.url_field and isinstance(item, Document):
        url = field_at(fields, spec.url_field)
        if isinstance(url, str) and url:
            item.url = url
    return item


def decode_pair(doc_id: Any, text: Any, source: Source, spec: InputSpec, url: Optional[str] = None) -> Item:
    """The document of an id and a text given separately (the Python API's ``add``), or why there is none."""
    if doc_id is None or doc_id == "":
        return Rejected("bad_id", "the id is missing: give every document a string or integer id", source)
    checked, id_problem = _document_id({"id": doc_id}, _ID_ONLY, None)
    if id_problem:
        return problem_at(id_problem, source)
    item = _checked_text(text, checked, source, spec)
    if url and isinstance(item, Document):
        item.url = url
    return item


def _fits_output(doc: Document, value: bytes, key: Optional[bytes], headers: tuple, spec: InputSpec) -> Item:
    """The document, or its rejection if, kept, it would be larger than the clean topic accepts.

    The record's size is measured by ``spec.kept_bytes``, the sink's own
    measure (handed in by the worker, so decoding stays free of Kafka).
    """
    size, limit = spec.kept_bytes(doc.id, doc.source, value, key, headers), spec.max_output_bytes
    if size <= limit:
        return doc
    return Rejected("too_large_for_output", f"kept, it would take {size} bytes on the clean topic, more than its "
                    f"max.message.bytes {limit}: raise that, or lower input.max_record_bytes", doc.source, doc.id)


def _decoded(value: Optional[bytes], source: Source, spec: InputSpec, key: Optional[bytes]) -> Item:
    if value is None:
        return Rejected("tombstone", "the record has no value", source)
    if len(value) > spec.max_record_bytes:
        return Rejected("too_large", f"{len(value)} bytes > max_record_bytes {spec.max_record_bytes}", source)
    key_id, problem = _key_id(key, spec)
    if problem:
        return problem_at(problem, source)
    if spec.format == "html":
        return _html_page(value, key_id or source.fallback_id(), source, spec, key_id)
    if spec.format == "text":
        fields: Any = None
        text = _utf8(value)
        if text is None:
            return Rejected("invalid_utf8", "the value is not valid UTF-8", source)
    else:
        fields = _parse(value, spec)
        if isinstance(fields, Rejected):
            return Rejected(fields.reason, fields.detail, source)
        text = field_at(fields, spec.text_field)
    doc_id, id_problem = _document_id(fields, spec, key_id)
    if id_problem:
        return problem_at(id_problem, source)
    page = _html_of(fields, doc_id or source.fallback_id(), source, spec) if fields is not None else None
    if page is not None:
        return page
    item = _checked_text(text, doc_id or source.fallback_id(), source, spec)
    if fields is not None and spec.url_field and isinstance(item, Document):
        url = field_at(fields, spec.url_field)
        if isinstance(url, str) and url:
            item.url = url
    return item


def _html_page(page, doc_id: str, source: Source, spec: InputSpec, url: Optional[str] = None) -> Item:
    """The main content of an HTML page (bytes or str) as a document; the key names it, and is its URL if it is one."""
    if not spec.main_content:
        return Document(doc_id, "", source)
    markup = html_text(page)
    if markup is None:
        return Rejected("not_decodable", "no encoding reads the page's bytes", source, doc_id)
    item = _checked_text(main_text(markup), doc_id, source, spec)
    if isinstance(item, Rejected) and item.reason in ("empty_text", "missing_text"):
        return Rejected("no_main_content", "the page has no main content to extract", source, doc_id)
    if isinstance(item, Document) and url and url.startswith(("http://", "https://")):
        item.url = url
    return item


def _html_of(fields: dict, doc_id: str, source: Source, spec: InputSpec) -> Optional[Item]:
    """With ``input.html_field``, the document of the page whose HTML that field of the record holds (its main
    content is the text; ``url_field`` names its site); None when the record has no such field (its text field
    is read then, so records with and without their HTML may be mixed)."""
    if not spec.html_field:
        return None
    page = field_at(fields, spec.html_field)
    if page is None:
        return None
    if not isinstance(page, str):
        return Rejected("text_not_string", f"{spec.html_field!r} is a {type(page).__name__}", source, doc_id)
    url = field_at(fields, spec.url_field) if spec.url_field else None
    item = _html_page(page, doc_id, source, spec)
    if isinstance(item, Document) and isinstance(url, str) and url:
        item.url = url
    return item


def decode_warc_line(value: bytes, source: Source, spec: InputSpec) -> Item:
    """A WARC response as ``runtime.warc`` hands it over: a JSON line {"id", "url", "html"} or {"id", "rejected"}."""
    record = orjson.loads(value)
    if "rejected" in record:
        reason, _, detail = record["rejected"].partition(": ")
        return Rejected(reason, detail, source, record["id"])
    return _html_page(record["html"], record["id"], source, spec, record["url"])


def problem_at(problem: tuple[str, str], source: Source) -> Rejected:
    return Rejected(problem[0], problem[1], source)


def _checked_text(text: Any, doc_id: str, source: Source, spec: InputSpec) -> Item:
    if text is None:
        return Rejected("missing_text", f"no field {spec.text_field!r}", source, doc_id)
    if not isinstance(text, str):
        return Rejected("text_not_string", f"{spec.text_field!r} is a {type(text).__name__}", source, doc_id)
    if text.isascii():  # a flag in CPython: no scan, and the length is the UTF-8 size
        size = len(text)
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError as exc:
            return Rejected("invalid_text", f"not encodable as UTF-8 at character {exc.start}", source, doc_id)
    if size > spec.max_text_bytes:
        return Rejected("text_too_large", f"{size} bytes > max_text_bytes {spec.max_text_bytes}", source, doc_id)
    if not text or text.isspace():
        return Rejected("empty_text", "the text is empty", source, doc_id)
    return Document(doc_id, text, source)


def _utf8(value: bytes) -> Optional[str]:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return None


_ID_ONLY = InputSpec(id_field="id")  # ``decode_pair`` checks a bare id with the id field's rules
_NOWHERE = Source("", -1, 0)  # parsing problems get their real source in ``decode``


def _parse(value: bytes, spec: InputSpec) -> Any:
    """The parsed object, or a Rejected (without source) saying why not."""
    if spec.format == "msgpack":
        try:
            obj = msgpack.unpackb(value, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises several unrelated types for bad bytes
            return Rejected("invalid_msgpack", str(exc)[:200] or type(exc).__name__, _NOWHERE)
    else:
        try:
            obj = orjson.loads(value)
        except orjson.JSONDecodeError:
            obj = None
        if not _as_json_reads_it(obj, spec):
            obj = _parse_json_strictly(value)
            if isinstance(obj, Rejected):
                return obj
    if not isinstance(obj, dict):
        return Rejected("not_an_object", f"top level is a {type(obj).__name__}", _NOWHERE)
    return obj


def _as_json_reads_it(obj: Any, spec: InputSpec) -> bool:
    """Whether what ``orjson`` read is, in the fields used, what ``json`` reads: a string text, no float id.

    ``orjson`` decodes 2.5 times faster than ``json`` and gives the same
    objects, strings and integers, except that it refuses a few documents
    ``json`` takes (lone surrogate escapes, NaN) and reads integers beyond
    64 bits as floats. A refused document, a text that is not a string and
    a float id go through ``json`` again, so every outcome is ``json``'s
    (tested on generated documents).
    """
    return (isinstance(obj, dict) and type(field_at(obj, spec.text_field)) is str
            and not isinstance(field_at(obj, spec.id_field) if spec.id_field else None, float))


def _parse_json_strictly(value: bytes) -> Any:
    """What ``json`` makes of a value, or a Rejected (without source) saying why not."""
    text = _utf8(value)
    if text is None:
        return Rejected("invalid_utf8", "the value is not valid UTF-8", _NOWHERE)
    try:
        return json.loads(text, parse_int=_json_int)
    except ValueError as exc:
        detail = "blank line" if not text.strip() else str(exc)[:200]
        return Rejected("invalid_json", detail, _NOWHERE)
    except RecursionError:
        return Rejected("invalid_json", "nested too deeply to decode", _NOWHERE)


class LongInteger:
    """A JSON integer too long for Python to convert (over ``sys.get_int_max_str_digits()`` digits)."""

    __slots__ = ("digits",)

    def __init__(self, digits: str):
        self.digits = digits


def _json_int(digits: str) -> Any:
    """An integer as ``json`` reads it, or a ``LongInteger`` where ``int()`` refuses (an id: ``bad_id``)."""
    try:
        return int(digits)
    except ValueError:
        return LongInteger(digits)


def field_at(obj: dict, path: str) -> Any:
    """The value at a dotted path, or None."""
    parts = _parts(path)
    if len(parts) == 1:
        return obj.get(path)
    for part in parts:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


@lru_cache(maxsize=64)
def _parts(path: str) -> tuple[str, ...]:
    return tuple(path.split("."))


def _key_id(key: Optional[bytes], spec: InputSpec) -> tuple[Optional[str], Optional[tuple[str, str]]]:
    if key is None:
        return None, None
    text = _utf8(key)
    if text is None:
        if spec.binary_keys == "reject":
            return None, ("invalid_key", "the record key is not valid UTF-8")
        return None, None
    return (text or None), None


def _document_id(fields: Any, spec: InputSpec, key_id: Optional[str]) -> tuple[Optional[str], Optional[tuple[str, str]]]:
    """The id field, else the key; None means: use the source coordinates."""
    raw = field_at(fields, spec.id_field) if (fields is not None and spec.id_field) else None
    if raw is None or raw == "":
        return key_id, None
    if isinstance(raw, LongInteger):
        return None, ("bad_id", f"integer id of {len(raw.digits)} characters > {MAX_ID_CHARS}")
    if isinstance(raw, bool) or not isinstance(raw, (str, int)):
        return None, ("bad_id", f"{spec.id_field!r} is a {type(raw).__name__}, not a string or integer")
    doc_id = str(raw)
    if not doc_id.isascii() and _unencodable(doc_id):
        return None, ("bad_id", "the id holds lone surrogates (not encodable as UTF-8)")
    if len(doc_id) > MAX_ID_CHARS:
        return None, ("bad_id", f"id of {len(doc_id)} characters > {MAX_ID_CHARS}")
    return doc_id, None


def _unencodable(text: str) -> bool:
    try:
        text.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True
