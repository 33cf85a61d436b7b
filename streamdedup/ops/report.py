"""The report: one self-contained HTML page of an index's figures (``streamdedup report``).

The page needs no network: no scripts, no style sheets or fonts from
elsewhere; each plot is an SVG drawn by matplotlib (the ``report`` extra)
and embedded as a ``data:`` URI in an ``<img>``, so the plots' own ids
cannot collide and the file can be mailed or attached to a ticket as it is.
Plots are drawn on ``matplotlib.figure.Figure`` objects, never through
pyplot, so no GUI backend or global state is involved (Agg-like, headless).
"""

from __future__ import annotations

import base64
import html
import io
import shlex
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np

from ..core.lsh import approx_threshold, s_curve
from ..engine.census import SIMILARITY_BINS, Census, ClusterSummary
from ..errors import MissingExtraError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["render_report", "write_report", "explain_command", "figure_class"]

INSTALL_HINT = "pip install 'streamdedup[report]'"
_KEPT, _DUPLICATE, _EXCERPT, _THRESHOLD = "#4c72b0", "#dd8452", "#55a868", "#c44e52"
MIN_TIME_BUCKETS = 3  # fewer (a quick offline run): the time panel says so and points to the decision order
_FIGURE_SIZE = (9.0, 3.6)  # inches; the page shows each plot at most 900 CSS pixels wide (img.plot)
_STYLE = """
body { font-family: "DejaVu Sans", Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 960px;
       color: #222; background: #fff; line-height: 1.4; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { font-size: 1.25em; margin-top: 2em;
     border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
code { font-size: 0.85em; background: #f6f6f6; padding: 0.1em 0.3em; word-break: break-all; }
img.plot { width: 100%; max-width: 900px; display: block; margin: 0.5em 0; }
p.note { color: #555; font-size: 0.9em; } .kept { color: #4c72b0; } .near { color: #dd8452; }
.exact { color: #8c564b; } .excerpt { color: #55a868; }
"""


def figure_class() -> type["Figure"]:
    """matplotlib's ``Figure``, or a ``MissingExtraError`` that says how to install it."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise MissingExtraError("the report draws its plots with matplotlib, which is not installed: "
                                f"{INSTALL_HINT} (or pip install 'matplotlib>=3.8')") from None
    return Figure


def write_report(census: Census, out: str, options: Sequence[str] = ()) -> int:
    """Write the report to the file ``out``; the bytes written."""
    page = render_report(census, options).encode("utf-8")
    with open(out, "wb") as handle:
        handle.write(page)
    return len(page)


def explain_command(doc_id: str, options: Sequence[str] = (), command: str = "explain") -> str:
    """The shell command that explains one decision (``options``: --state, --config as the report was run)."""
    return " ".join(["streamdedup", command, shlex.quote(doc_id), *map(shlex.quote, options)])


def render_report(census: Census, options: Sequence[str] = ()) -> str:
    """The whole page: summary, four plots, the largest clusters."""
    Figure = figure_class()
    from matplotlib import rc_context

    with rc_context({"svg.hashsalt": "streamdedup", "font.size": 9}):
        plots = [
            ("Duplicate rate over time", _rate_plot(Figure, census), _rate_note(census)),
            ("Cluster sizes", _sizes_plot(Figure, census), _sizes_note(census)),
            ("Similarity of duplicates", _similarity_plot(Figure, census), _similarity_note(census)),
            ("The index's S-curve", _s_curve_plot(Figure, census), _s_curve_note(census)),
        ]
    sections = "".join(
        f'<h2>{html.escape(title)}</h2>\n<img class="plot" alt="{html.escape(title)}" src="{uri}">\n'
        f'<p class="note">{note}</p>\n' for title, uri, note in plots)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>streamdedup report: {html.escape(census.path)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n"
        f"<h1>streamdedup report</h1>\n{_summary(census)}\n{sections}"
        f"<h2>Largest clusters</h2>\n{_largest(census, options)}\n</body>\n</html>\n"
    )


# -- text --------------------------------------------------------------


def _when(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _summary(census: Census) -> str:
    rows = [
        ("index", html.escape(census.path)),
        ("configuration", f"<code>{html.escape(census.fingerprint)}</code>"),
        ("documents", f"{census.documents:,}"),
        ("kept (clusters)", f"{census.kept:,}" + (f" ({census.expired:,} expired)" if census.expired else "")),
        ("duplicates", f"{census.duplicates:,} ({census.duplicate_rate:.2%}): {census.near:,} near, "
                       f"{census.exact:,} exact copies, {census.excerpts:,} excerpts"
                       + (f"; {census.unclustered:,} left without a cluster by forget" if census.unclustered
                          else "")),
        ("decided", f"{_when(census.first_time)} to {_when(census.last_time)}"),
        ("report taken", _when(census.taken_at)),
    ]
    body = "".join(f"<tr><th>{name}</th><td>{value}</td></tr>" for name, value in rows)
    return f"<table>{body}</table>"


def _rate_note(census: Census) -> str:
    width = _duration(census.bucket_seconds)
    return (f"Top: documents decided per {width} (grey bars, left axis) and the share of them that were "
            f"duplicates (line, right axis), by decision time (UTC). Bottom: the same over the decision order, "
            f"in slices of {census.order_width:,} documents: a backfill decides months of crawl in hours, so "
            "its trend shows there.")


def _sizes_note(census: Census) -> str:
    if not census.cluster_sizes:
        return "No clusters yet."
    biggest = max(census.cluster_sizes)
    return (f"{census.clusters:,} clusters; {census.cluster_sizes.get(1, 0):,} hold a single document, the "
            f"largest holds {biggest:,}. A cluster is a kept document and the duplicates decided against it.")


def _similarity_note(census: Census) -> str:
    return (f"Exact Jaccard similarity of each near duplicate (orange) and excerpt (green) to the kept document it "
            f"matched, in bins of {1 / SIMILARITY_BINS:.2f}; the red line is the threshold "
            f"{census.threshold:g}. Exact copies ({census.exact:,}, similarity 1.0 after normalization) are left "
            "out. Excerpts lie below the threshold: they are matched by containment, not similarity.")


def _s_curve_note(census: Census) -> str:
    p = float(s_curve(census.threshold, census.bands, census.rows, census.min_shared))
    shared = f", sharing at least {census.min_shared} bands" if census.min_shared > 1 else ""
    return (f"{census.bands} bands x {census.rows} rows of a {census.num_perm}-value signature{shared}: the "
            f"probability that a pair of this similarity is ever compared. At the threshold {census.threshold:g} "
            f"it is {p:.2%} (the expected recall); the curve is half way up near "
            f"{approx_threshold(census.bands, census.rows):.3f}. <code>streamdedup params --threshold "
            f"{census.threshold:g} --bands {census.bands} --rows {census.rows} --min-shared {census.min_shared}"
            "</code> prints the same curve as a table.")


def _duration(seconds: int) -> str:
    for unit, size in (("year", 365 * 86400), ("month", 30 * 86400), ("week", 7 * 86400), ("day", 86400),
                       ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = seconds // size
            return unit if count == 1 else f"{count} {unit}s"
    return "second" if seconds == 1 else f"{seconds} seconds"


def _largest(census: Census, options: Sequence[str]) -> str:
    if not census.largest or census.largest[0].size < 2:
        return "<p>No cluster has a duplicate yet.</p>"
    intro = ("<p class=\"note\">Each cluster's representative (the kept document) and its members in decision "
             "order. Every row ends with the command that explains that decision (add <code>--texts</code> "
             "with the input files to see the passages side by side); "
             f"<code>{html.escape(explain_command('ID', options, 'cluster'))}</code> lists a whole cluster.</p>")
    return intro + "".join(_cluster_table(rank, cluster, options)
                           for rank, cluster in enumerate(census.largest, 1) if cluster.size > 1)


def _cluster_table(rank: int, cluster: ClusterSummary, options: Sequence[str]) -> str:
    rep = cluster.representative
    rows = [_member_row(rep, options)] + [_member_row(member, options) for member in cluster.members]
    more = (f"<tr><td colspan=\"5\">... and {cluster.members_left_out:,} more: "
            f"<code>{html.escape(explain_command(rep['id'], options, 'cluster'))}</code></td></tr>"
            if cluster.members_left_out > 0 else "")
    return (f"<h3>{rank}. {html.escape(rep['id'])}: {cluster.size:,} documents</h3>\n<table><tr><th>document</th>"
            "<th>decision</th><th>similarity</th><th>decided</th><th>explain</th></tr>"
            + "".join(rows) + more + "</table>\n")


def _member_row(row: dict, options: Sequence[str]) -> str:
    relation = row["relation"]
    label = {"kept": "kept (representative)", "near": "near duplicate", "exact": "exact copy",
             "excerpt": "excerpt"}[relation] + (" (expired)" if row["expired"] else "")
    similarity = "" if row["similarity"] is None else f"{row['similarity']:.3f}"
    if row["containment"] is not None:
        similarity += f" ({row['containment']:.3f} contained)"
    return (f"<tr><td>{html.escape(row['id'])}</td><td class=\"{relation}\">{label}</td><td class=\"n\">"
            f"{similarity}</td><td>{_when(row['time'])}</td>"
            f"<td><code>{html.escape(explain_command(row['id'], options))}</code></td></tr>")


# -- plots -------------------------------------------------------------


def _svg_uri(figure: "Figure") -> str:
    """The figure as an SVG ``data:`` URI (no date in it, so the same figures give the same bytes)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="svg", metadata={"Date": None})
    return "data:image/svg+xml;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _empty(axes, text: str) -> None:
    axes.text(0.5, 0.5, text, ha="center", va="center", transform=axes.transAxes, color="#777")
    axes.set_xticks([])
    axes.set_yticks([])


def _rate_plot(Figure, census: Census) -> str:
    figure = Figure(figsize=(_FIGURE_SIZE[0], _FIGURE_SIZE[1] * 1.7), layout="constrained")
    by_time, by_order = figure.subplots(2, 1)
    if not census.timeline:
        _empty(by_time, "no documents yet")
        _empty(by_order, "no documents yet")
        return _svg_uri(figure)
    if len(census.timeline) < MIN_TIME_BUCKETS:
        seconds = max((census.last_time or 0.0) - (census.first_time or 0.0), 1.0)
        _empty(by_time, f"all {census.documents:,} documents were decided within {seconds:,.0f} s: "
               "see the decision order below")
    else:
        dates = [datetime.fromtimestamp(bucket.start, timezone.utc) for bucket in census.timeline]
        _rate_axes(by_time, dates, census.timeline, timedelta(seconds=census.bucket_seconds), "decision time (UTC)")
    _rate_axes(by_order, [bucket.start for bucket in census.by_order], census.by_order, census.order_width,
               "decision order (document serial)")
    return _svg_uri(figure)


def _rate_axes(axes, starts: list, buckets: list, width, label: str) -> None:
    """Documents decided per bucket (bars) and their duplicate rate (line); ``width`` of the starts' type."""
    decided = [bucket.decided for bucket in buckets]
    axes.bar(starts, decided, width=width, align="edge", color="#cccccc", label="documents decided")
    axes.set_ylabel("documents")
    axes.set_xlabel(label)
    rate = axes.twinx()
    centres = [start + width / 2 for start in starts]
    rate.plot(centres, [100.0 * bucket.duplicate_rate for bucket in buckets], color=_DUPLICATE, marker="o",
              markersize=3, label="duplicate rate")
    rate.set_ylabel("duplicates (%)")
    rate.set_ylim(0, 102)  # a line at 100 % stays in view


def _sizes_plot(Figure, census: Census) -> str:
    figure = Figure(figsize=_FIGURE_SIZE, layout="constrained")
    axes = figure.subplots()
    if not census.cluster_sizes:
        _empty(axes, "no clusters yet")
        return _svg_uri(figure)
    sizes, counts = list(census.cluster_sizes), list(census.cluster_sizes.values())
    if max(sizes) <= 40:
        axes.bar(sizes, counts, color=_KEPT)
        axes.set_xticks(sizes if len(sizes) <= 20 else sizes[::max(1, len(sizes) // 20)])
    else:
        axes.scatter(sizes, counts, color=_KEPT, s=12)
        axes.set_xscale("log")
    from matplotlib.ticker import NullFormatter, StrMethodFormatter

    axes.set_yscale("log")
    axes.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    axes.yaxis.set_minor_formatter(NullFormatter())
    axes.set_xlabel("documents in the cluster")
    axes.set_ylabel("clusters")
    return _svg_uri(figure)


def _similarity_plot(Figure, census: Census) -> str:
    figure = Figure(figsize=_FIGURE_SIZE, layout="constrained")
    axes = figure.subplots()
    if not census.near + census.excerpts:
        _empty(axes, "no near duplicates or excerpts yet"
               + (f" ({census.exact:,} exact copies)" if census.exact else ""))
        return _svg_uri(figure)
    edges = np.linspace(0.0, 1.0, SIMILARITY_BINS + 1)
    width = edges[1] - edges[0]
    axes.bar(edges[:-1], census.near_similarity, width=width, align="edge", color=_DUPLICATE, label="near duplicates")
    axes.bar(edges[:-1], census.excerpt_similarity, width=width, align="edge", bottom=census.near_similarity,
             color=_EXCERPT, label="excerpts")
    axes.axvline(census.threshold, color=_THRESHOLD, linestyle="--", label=f"threshold {census.threshold:g}")
    axes.set_xlim(0, 1)
    axes.set_xlabel("Jaccard similarity to the matched kept document")
    axes.set_ylabel("duplicates")
    axes.legend(loc="upper left", frameon=False)
    return _svg_uri(figure)


def _s_curve_plot(Figure, census: Census) -> str:
    figure = Figure(figsize=_FIGURE_SIZE, layout="constrained")
    axes = figure.subplots()
    similarity = np.linspace(0.0, 1.0, 401)
    probability = s_curve(similarity, census.bands, census.rows, census.min_shared)
    axes.plot(similarity, probability, color=_KEPT,
              label=f"{census.bands} bands x {census.rows} rows, min shared {census.min_shared}")
    axes.fill_between(similarity, probability, where=similarity < census.threshold, color=_KEPT, alpha=0.15,
                      label="compared below the threshold (verified, then rejected)")
    axes.fill_between(similarity, probability, 1.0, where=similarity >= census.threshold, color=_THRESHOLD,
                      alpha=0.15, label="missed above the threshold")
    axes.axvline(census.threshold, color=_THRESHOLD, linestyle="--", label=f"threshold {census.threshold:g}")
    axes.set_xlim(0, 1)
    axes.set_ylim(0, 1.02)
    axes.set_xlabel("Jaccard similarity of a pair")
    axes.set_ylabel("P(compared)")
    axes.legend(loc="upper left", frameon=False)
    return _svg_uri(figure)
