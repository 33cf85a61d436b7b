"""The main-content extractor on real documentation pages, and on copies of them in other markup.

A republished page is often its source's text in another site's markup. On
pages of documentation installed on this machine (the Node.js API reference
of Debian's ``nodejs-doc``, the Valgrind manual of ``valgrind``, the Rust
toolchain's mdBook books and rustdoc pages under ``~/.rustup``; a set not
installed is skipped), each page's main content is what its generator's own
container holds (``#apicontent``, ``.chapter``, ``main``, ``#main-content``).
For each extractor, in a fresh process:

- body recovered and template left, as in ``bench/html_input.py``;
- copies: each page's content moved as plain paragraphs (a ``<p>`` per line
  of its text) into another site's template and extracted again; the share
  of pages whose copy comes out at a Jaccard of at least 0.7 (the default
  ``lsh.threshold``) with the page, and the median Jaccard;
- pages a second extracting the pages (the median of 5 passes in a child;
  rounds interleaved, medians of the rounds: the machine may be shared).

Contenders: ``core.html.main_text`` (what ``input.format = "html"`` uses) and
Resiliparse's ``extract_plain_text`` alone, as it was called before.

    .venv/bin/python -m bench.html_markup [--pages 120] [--runs 3]
"""

from __future__ import annotations

import argparse
import glob
import html
import json
import os
import random
import statistics
import time
from pathlib import Path

from bench import harness
from bench.crawl_accuracy import contained, jaccard, shingle_sets

RUST = str(Path.home() / ".rustup/toolchains/*/share/doc/rust/html")
SETS = {  # name: (file patterns, the generator's container of a page's main content)
    "Node.js API (nodejs-doc)": (["/usr/share/doc/nodejs/api/*.html"], "#apicontent"),
    "Valgrind manual (DocBook)": (["/usr/share/doc/valgrind/html/*.html"],
                                  ".chapter, .sect1, .book, .appendix, .article, .preface, .part, .set"),
    "Rust books (mdBook)": ([f"{RUST}/{book}/**/*.html" for book in ("book", "reference", "cargo", "nomicon",
                                                                     "rust-by-example", "rustc", "edition-guide")],
                            "main"),
    "Rust std (rustdoc)": ([f"{RUST}/std/**/*.html"], "#main-content"),
}
CONTENDERS = ("streamdedup", "resiliparse")
PASSES = 5  # a child extracts its pages this many times and reports the median pass
COPY_TEMPLATE = ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>Mirror</title></head><body>"
                 "<header><nav><a href=\"/\">Home</a> <a href=\"/news\">News</a> <a href=\"/about\">About us</a></nav>"
                 "</header><main><article>{}</article><aside><h2>Popular</h2><p>Ten tips for faster builds</p></aside>"
                 "</main><footer><p>Mirrored for offline reading. Contact the webmaster.</p></footer></body></html>")


def extractor(name: str):
    if name == "streamdedup":
        from streamdedup.core.html import main_text

        return main_text
    from resiliparse.extract.html2text import extract_plain_text

    return lambda page: extract_plain_text(page, main_content=True, alt_texts=False, noscript=False)


def pages_of(name: str, count: int) -> tuple[list[str], list[str]]:
    """A seeded sample of a set's pages (2 KB to 400 KB) with a main content of 30 words or more, and that content."""
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.html import HTMLTree

    patterns, container = SETS[name]
    files = sorted({f for p in patterns for f in glob.glob(p, recursive=True)
                    if 2_000 < os.path.getsize(f) < 400_000 and not f.endswith("print.html")})
    pages, contents = [], []
    for path in random.Random(7).sample(files, min(len(files), count * 2)):
        page = Path(path).read_text(encoding="utf-8", errors="replace")
        region = HTMLTree.parse(page).body.query_selector(container)
        content = region and extract_plain_text(region.html, list_bullets=False, alt_texts=False, noscript=False)
        if content and len(content.split()) >= 30 and len(pages) < count:
            pages.append(page)
            contents.append(content)
    return pages, contents


def copy_of(content: str) -> str:
    """The content as plain paragraphs, a line each, in another site's template."""
    return COPY_TEMPLATE.format("".join(f"<p>{html.escape(line)}</p>" for line in content.splitlines() if line.strip()))


def run_child(contender: str, name: str, count: int) -> dict:
    pages, contents = pages_of(name, count)
    extract = extractor(contender)
    extract(pages[0])  # imports done before the clock starts
    seconds = []
    for _ in range(PASSES):
        began = time.perf_counter()
        texts = [extract(page) or "-" for page in pages]
        seconds.append(time.perf_counter() - began)
    copies = [extract(copy_of(content)) or "-" for content in contents]
    truth, found, copied = shingle_sets(contents), shingle_sets(texts), shingle_sets(copies)
    similar = [jaccard(f, c) for f, c in zip(found, copied)]
    return {"pages": len(pages), "pages_per_s": len(pages) / statistics.median(seconds),
            "body_recovered": statistics.fmean(contained(t, f) for t, f in zip(truth, found)),
            "not_body": statistics.fmean(1 - contained(f, t) for t, f in zip(truth, found)),
            "copies_found": sum(s >= 0.7 for s in similar) / len(similar), "copy_jaccard": statistics.median(similar)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=120)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_child(*args.child, args.pages)))
        return
    for name, (patterns, _) in SETS.items():
        if not any(glob.glob(p, recursive=True) for p in patterns):
            print(f"\n{name}: not installed, skipped")
            continue
        results: dict[str, dict] = {}

        def measure(contender: str, _round: int) -> float:
            results[contender] = harness.child("bench.html_markup", contender, name, "--pages", str(args.pages))
            return results[contender]["pages_per_s"]

        print(f"\n{name}: {args.pages} pages, each extractor in a fresh process (median of {args.runs})")
        rates = harness.interleaved(CONTENDERS, args.runs, measure, alternate=True, log=None, unit="pages/s")
        columns = {label: {c: f"{results[c][key]:.3f}" for c in CONTENDERS}
                   for label, key in (("body recovered", "body_recovered"), ("template left", "not_body"),
                                      ("copies at J >= 0.7", "copies_found"), ("median copy J", "copy_jaccard"))}
        print(harness.table(rates, "resiliparse", unit="pages/s", name="extractor", columns=columns))


if __name__ == "__main__":
    main()
