"""Report benchmark: what `streamdedup report` costs on an index of about 100,000 documents.

Builds the index once with `streamdedup dedup` on the sample crawl (53,800
articles: 99,595 documents), then times, alternating, `streamdedup stats`
(the peer: the cheapest read-only command, which opens the index and reads
its counters) and `streamdedup report`, each a fresh process as a user runs
it, and in-process the two halves of the report: counting the index
(``take_census``) and drawing the page (``render_report``). Prints medians
and the report's ratio to the peer.

Run: ``python -m bench.report`` (``--articles 53800 --repeat 5``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench import harness
from streamdedup import config as config_module
from streamdedup.engine.census import take_census
from streamdedup.engine.engine import Engine
from streamdedup.ops.report import render_report


def cli(*args: str) -> float:
    """Seconds one `streamdedup ARGS` process takes."""
    return harness.timed([sys.executable, "-m", "streamdedup", *args])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--articles", type=int, default=53800)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        crawl, state, out = Path(folder) / "crawl.jsonl", Path(folder) / "state", Path(folder) / "report.html"
        cli("sample", "--articles", str(args.articles), "--out", str(crawl))
        built = cli("dedup", str(crawl), "--state", str(state), "--no-progress")
        times: dict[str, list[float]] = {"stats": [], "report": [], "census": [], "render": []}
        for _ in range(args.repeat):
            times["stats"].append(cli("stats", "--state", str(state)))
            times["report"].append(cli("report", "--state", str(state), "--out", str(out)))
            with Engine(config_module.load(None, environ={}), str(state), readonly=True) as engine:
                started = time.perf_counter()
                census = take_census(engine)
                times["census"].append(time.perf_counter() - started)
            started = time.perf_counter()
            render_report(census)
            times["render"].append(time.perf_counter() - started)
        median = {name: statistics.median(values) for name, values in times.items()}
        print(f"index: {census.documents:,} documents, {census.clusters:,} clusters, built by dedup in {built:.1f} s; "
              f"report {out.stat().st_size:,} bytes; medians of {args.repeat} runs")
        for name, label in (("stats", "streamdedup stats (peer)"), ("report", "streamdedup report"),
                            ("census", "  counting the index (take_census)"), ("render", "  drawing the page")):
            print(f"{label:<36} {median[name]:>7.2f} s")
        print(f"report / stats: {median['report'] / median['stats']:.1f}x; "
              f"census: {census.documents / median['census']:,.0f} documents/s")


if __name__ == "__main__":
    main()
