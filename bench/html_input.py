"""HTML input: which main-content extractor, and what HTML costs end to end.

1. Extractors, each in a fresh process, on the web crawl sample served as
   HTML (``core.webcrawl.as_html``): pages a second, the share of each page's
   own body recovered, and the share of the extracted text that is not body
   (template left in). Contenders: ``core.html.main_text`` (what
   ``input.format = "html"`` uses: Resiliparse's ``extract_plain_text`` with
   ``main_content``, after its pass that makes lists judged as paragraphs),
   Resiliparse alone (the call without that pass) and trafilatura (default
   and ``fast`` mode), if installed.
2. ``streamdedup dedup`` as a whole process, on the same crawl as a WARC file
   against the same pages as JSONL text: docs/s and the accuracy scorer's
   figures on both.

    .venv/bin/python -m bench.html_input [--pages 3000] [--sites 40] [--runs 3] [--extractors-only]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import harness
from bench.crawl_accuracy import contained, score, shingle_sets
from streamdedup.core.webcrawl import as_html, generate_web, web_jsonl_lines

EXTRACTORS = ("streamdedup", "resiliparse", "trafilatura-fast", "trafilatura")


def extractor(name: str):
    if name == "streamdedup":
        from streamdedup.core.html import main_text

        return main_text
    if name == "resiliparse":
        from resiliparse.extract.html2text import extract_plain_text

        return lambda page: extract_plain_text(page, main_content=True, alt_texts=False, noscript=False)
    import trafilatura

    fast = name == "trafilatura-fast"
    return lambda page: trafilatura.extract(page, include_comments=False, include_tables=False, fast=fast)


def run_extractor(name: str, pages: int, sites: int) -> dict:
    """In this (fresh) process: one extractor over the served pages."""
    crawl = generate_web(pages, sites, 5, "invented")
    served = [as_html(page) for page in crawl]
    extract = extractor(name)
    extract(served[0])  # imports done before the clock starts
    began = time.perf_counter()
    texts = [extract(page) or "" for page in served]
    seconds = time.perf_counter() - began
    bodies, found = shingle_sets([page.body for page in crawl]), shingle_sets([t or "-" for t in texts])
    return {"pages_per_s": len(served) / seconds,
            "body_recovered": statistics.fmean(contained(b, f) for b, f in zip(bodies, found)),
            "not_body": statistics.fmean(1 - contained(f, b) for b, f in zip(bodies, found)),
            "empty": sum(not t for t in texts)}


def _warc_record(uri: str, body: bytes, number: int) -> bytes:
    payload = (f"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {len(body)}\r\n\r\n"
               ).encode() + body
    head = (f"WARC/1.1\r\nWARC-Type: response\r\nWARC-Target-URI: {uri}\r\n"
            f"WARC-Record-ID: <urn:uuid:00000000-0000-0000-0000-{number:012d}>\r\nWARC-Date: 2026-12-01T00:00:00Z\r\n"
            f"Content-Type: application/http; msgtype=response\r\nContent-Length: {len(payload)}\r\n\r\n").encode()
    return gzip.compress(head + payload + b"\r\n\r\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=3000)
    parser.add_argument("--sites", type=int, default=40)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--extractors-only", action="store_true", help="part 1 alone")
    parser.add_argument("--contender", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.contender:
        print(json.dumps(run_extractor(args.contender, min(args.pages, 600), args.sites)))
        return

    print(f"1. Main-content extractors, 600 pages of the web crawl sample as HTML, each in a fresh process, "
          f"rounds interleaved (median of {args.runs})")
    results: dict[str, dict] = {}

    def measure(name: str, _round: int) -> float:
        done = subprocess.run([sys.executable, "-m", "bench.html_input", "--contender", name, "--pages",
                               str(args.pages), "--sites", str(args.sites)], capture_output=True, text=True,
                              cwd=harness.ROOT)
        if done.returncode:
            raise RuntimeError(done.stderr.strip().splitlines()[-1])
        results[name] = json.loads(done.stdout)
        return results[name]["pages_per_s"]

    installed = []
    for name in EXTRACTORS:
        try:
            measure(name, 0)
            installed.append(name)
        except RuntimeError as error:
            print(f"   {name}: not measured: {error}")
    rates = harness.interleaved(installed, args.runs, measure, alternate=True, log=None, unit="pages/s")
    columns = {label: {name: f"{results[name][key]:.3f}" for name in installed}
               for label, key in (("body recovered", "body_recovered"), ("extracted text not body", "not_body"))}
    columns["empty"] = {name: str(results[name]["empty"]) for name in installed}
    print(harness.table(rates, "resiliparse", unit="pages/s", name="extractor", columns=columns))
    if args.extractors_only:
        return

    crawl = generate_web(args.pages, args.sites, 5, "invented")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        text_file, warc_file = work / "crawl.jsonl", work / "crawl.warc.gz"
        lines = list(web_jsonl_lines(crawl))
        text_file.write_text("".join(lines))
        records = [json.loads(line) for line in lines]
        id_of_url = {page.url: page.id for page in crawl}
        with open(warc_file, "wb") as handle:
            for number, page in enumerate(crawl):
                handle.write(_warc_record(page.url, as_html(page).encode(), number))
        print(f"\n2. streamdedup dedup, {len(crawl):,} pages of {args.sites} sites, each run a fresh process "
              f"(median of {args.runs})")
        rates = {}
        off = ("templates.enabled=false",)
        for label, path, settings in (("JSONL text", text_file, ()), ("WARC, HTML", warc_file, ()),
                                      ("WARC, HTML, templates off", warc_file, off)):
            seconds = []
            for number in range(args.runs):
                state = work / f"state-{label.replace(' ', '').replace(',', '-')}-{number}"
                run = harness.dedup(str(path), str(state), settings, documents=len(crawl))
                seconds.append(run.seconds)
            decisions = run.decisions()
            rates[label] = len(crawl) / statistics.median(seconds)
            if path == warc_file:  # a WARC response is named by its URL
                decisions = [dict(d, id=id_of_url[d["id"]], matched=id_of_url.get(d["matched"], d["matched"]))
                             for d in decisions]
            figures = score(records, decisions).rates()
            print(f"   {label:26} {rates[label]:8,.0f} docs/s   false merges {figures['false_merges']:.2%}   "
                  f"republished found {figures['republished']:.2%}")
        print(f"   WARC/HTML against JSONL text: {rates['WARC, HTML'] / rates['JSONL text']:.2f}x docs/s")


if __name__ == "__main__":
    main()
