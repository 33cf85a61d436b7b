"""The ``streamdedup`` command: argparse subcommands, each returning an exit code."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from typing import Optional, Sequence

from . import __version__
from . import config as config_module
from .core.decode import InputSpec
from .errors import ConfigError, StreamdedupError

__all__ = ["main"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_PROBLEMS = 0, 1, 2, 3


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return args.handler(args)
    except ConfigError as exc:
        print(f"streamdedup: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except StreamdedupError as exc:
        print(f"streamdedup: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (| head): not an error of ours
        sys.stderr.close()
        return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="FILE", help="config.toml to read (default: none, built-in defaults)")
    common.add_argument("--set", metavar="SECTION.KEY=VALUE", action="append", default=[],
                        help="override one configuration key (repeatable)")
    common.add_argument("--state", metavar="DIR", help="index folder (overrides index.path)")
    sharded = argparse.ArgumentParser(add_help=False)
    sharded.add_argument("--shards", metavar="DIR[,DIR...]", action="append", default=[],
                         help="read a sharded deployment instead of --state: every vshard's state folder "
                         "(comma-separated or repeated), or the folder holding vshard-0 ... vshard-N; an incomplete "
                         "set is refused")

    parser = argparse.ArgumentParser(prog="streamdedup", description="Streaming near-duplicate deduplication "
                                     "of text with MinHash LSH and an on-disk LMDB index.")
    parser.add_argument("--version", action="version", version=f"streamdedup {__version__}")
    sub = parser.add_subparsers(metavar="COMMAND")

    dedup = sub.add_parser("dedup", parents=[common], help="deduplicate JSONL files (or stdin) offline")
    dedup.add_argument("inputs", nargs="+", metavar="INPUT", help="JSONL files; - reads stdin")
    dedup.add_argument("--out", metavar="CLEAN.jsonl", help="write the kept input lines here, byte for byte")
    dedup.add_argument("--decisions", metavar="DECISIONS.jsonl", help="one JSON decision per input line; - is stdout")
    dedup.add_argument("--restart", action="store_true", help="ignore an interrupted run's checkpoint and start over")
    dedup.add_argument("--learn-first", action="store_true",
                       help="read the inputs twice: learn every site's template, then decide (see docs/pages/crawler-pages.md)")
    dedup.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                       help="progress bar on stderr (default: when stderr is a terminal)")
    dedup.set_defaults(handler=_cmd_dedup)

    sample = sub.add_parser("sample", help="write the synthetic crawl corpus (JSONL with known families)")
    sample.add_argument("--articles", type=int, default=650, help="original articles (documents: about 1.86x)")
    sample.add_argument("--seed", type=int, default=42)
    sample.add_argument("--kind", choices=("articles", "web", "hot-keys"), default="articles",
                        help="articles and their copies (default), a web crawl (sites with templates, "
                        "republished articles, excerpts, short pages), or hot keys (documents filled into a few "
                        "boilerplate templates, and near copies of them)")
    sample.add_argument("--documents", type=int, default=2000, help="with --kind hot-keys: documents")
    sample.add_argument("--pages", type=int, default=3000, help="with --kind web: pages")
    sample.add_argument("--sites", type=int, default=40, help="with --kind web: sites")
    sample.add_argument("--prose", choices=("invented", "stdlib"), default="invented",
                        help="with --kind web: invented words, or the docstrings of Python's standard library")
    sample.add_argument("--out", default="-", help="file to write (default: stdout)")
    sample.set_defaults(handler=_cmd_sample)

    params = sub.add_parser("params", help="bands x rows for a threshold, and the S-curve")
    params.add_argument("--threshold", type=float, required=True)
    params.add_argument("--num-perm", type=int, default=128)
    params.add_argument("--recall", type=float, default=0.998,
                        help="share of pairs at the threshold that become candidates (default 0.998, as lsh.recall)")
    params.add_argument("--weights", type=float, nargs=2, metavar=("FP", "FN"),
                        help="choose by weighted false positives and negatives instead (datasketch's rule)")
    params.add_argument("--bands", type=int, help="show these bands (with --rows) instead of choosing")
    params.add_argument("--rows", type=int)
    params.add_argument("--min-shared", type=int, default=1, help="with --bands: bands a candidate must share")
    params.set_defaults(handler=_cmd_params)

    stats = sub.add_parser("stats", parents=[common, sharded], help="index size, counts and configuration (read-only)")
    stats.add_argument("--json", action="store_true")
    stats.set_defaults(handler=_cmd_stats)

    check = sub.add_parser("check", parents=[common], help="check the index's consistency (read-only)")
    check.add_argument("--fix", action="store_true", help="rebuild every lookup table from the document records "
                       "(needs the writer lock: stop the worker first)")
    check.set_defaults(handler=_cmd_check)

    query = sub.add_parser("query", parents=[common, sharded], help="the near-duplicates of a text in the index, or what "
                           "was learned of a site's template (read-only)")
    what = query.add_mutually_exclusive_group(required=True)
    what.add_argument("text", nargs="?", help="the text to look for")
    what.add_argument("--file", help="read the text from this file (- for stdin)")
    what.add_argument("--site", help="a site's host or a page URL: what was learned of its template")
    query.add_argument("--min-similarity", type=float, help="default: lsh.threshold")
    query.add_argument("--limit", type=int, default=20)
    query.add_argument("--json", action="store_true")
    query.set_defaults(handler=_cmd_query)

    cluster = sub.add_parser("cluster", parents=[common, sharded], help="a cluster's representative and members (read-only)")
    cluster.add_argument("id", help="a document id: the representative, or any member")
    cluster.add_argument("--json", action="store_true")
    cluster.add_argument("--limit", type=int, default=100,
                         help="show the earliest N members (default 100; 0: all); the total is always given")
    cluster.set_defaults(handler=_cmd_cluster)

    explain = sub.add_parser("explain", parents=[common, sharded], help="why a document was decided as it was: its match, "
                             "the similarity, shared bands and passages (read-only)")
    explain.add_argument("id", help="a document id")
    explain.add_argument("other", nargs="?", metavar="OTHER_ID", help="compare with this document instead of "
                         "the one it was matched to")
    explain.add_argument("--texts", metavar="FILE.jsonl", action="append", default=[],
                         help="input file(s) to find both texts in, for the passages (repeatable)")
    explain.add_argument("--text-a", metavar="TEXT", help="the text of ID (instead of --texts)")
    explain.add_argument("--text-b", metavar="TEXT", help="the text of the other document")
    explain.add_argument("--width", type=int, help="columns of the side-by-side passages (default: the terminal's)")
    explain.add_argument("--json", action="store_true")
    explain.set_defaults(handler=_cmd_explain)

    report = sub.add_parser("report", parents=[common], help="an HTML page of the index's figures: duplicate rate "
                            "over time, cluster sizes, similarities, S-curve, largest clusters (read-only; needs "
                            "streamdedup[report])")
    report.add_argument("--out", metavar="FILE.html", default="report.html", help="where to write the page "
                        "(default: report.html)")
    report.add_argument("--top", type=int, default=10, help="largest clusters to list (default 10)")
    report.add_argument("--members", type=int, default=20, help="members to list of each (default 20)")
    report.set_defaults(handler=_cmd_report)

    forget = sub.add_parser("forget", parents=[common], help="remove documents from the index (takedown, privacy)")
    forget.add_argument("ids", nargs="*", metavar="ID")
    forget.add_argument("--file", help="a file of ids, one per line")
    forget.add_argument("--timeout", type=float, default=120.0,
                        help="seconds to wait for a running worker to apply the request (default 120)")
    forget.set_defaults(handler=_cmd_forget)

    backup = sub.add_parser("backup", parents=[common], help="a consistent, compacted copy of the index, "
                            "safe while the worker runs")
    backup.add_argument("dest", help="an empty or new folder; receives data.mdb")
    backup.set_defaults(handler=_cmd_backup)

    restore = sub.add_parser("restore", parents=[common], help="bring a lost index folder back, from a backup "
                             "or from what the input topics still hold; the worker then replays, without "
                             "emitting, what was emitted after it")
    restore.add_argument("backup", nargs="?", help="the folder `streamdedup backup` wrote (holding data.mdb)")
    restore.add_argument("--from-topics", action="store_true", help="no backup: a new index that the worker fills "
                         "from the input topics' first offsets up to the group's committed offsets, emitting nothing")
    restore.add_argument("--replace", action="store_true", help="overwrite an index the folder still holds")
    restore.set_defaults(handler=_cmd_restore)

    run = sub.add_parser("run", parents=[common], help="the live worker: input topics -> clean / duplicates / "
                         "dead-letter topics, exactly one outcome per record")
    run.add_argument("--until-caught-up", action="store_true", help="stop (exit 0) once no input is left")
    run.add_argument("--role", choices=("worker", "sign", "vshards"), default="worker",
                     help="worker: the single worker (default); sign and vshards: the roles of a sharded deployment "
                     "(shards.count virtual shards, see deploy/README.md)")
    run.add_argument("--vshards", metavar="LIST", help="with --role vshards: the virtual shards this process "
                     "hosts, such as 0-7 or 0,2,4 (default: those the consumer group gives it)")
    run.add_argument("--until-idle", type=float, metavar="SECONDS", help="with --role sign: stop (exit 0) once "
                     "no input record came for this long")
    run.set_defaults(handler=_cmd_run)

    backfill = sub.add_parser("backfill", parents=[common], help="replay a topic into the index up to its "
                              "current end, then stop")
    backfill.add_argument("--topic", required=True)
    start = backfill.add_mutually_exclusive_group(required=True)
    start.add_argument("--from-beginning", action="store_true")
    start.add_argument("--from-timestamp", metavar="ISO", help="e.g. 2026-01-31T00:00:00Z (no zone: UTC)")
    backfill.add_argument("--index-only", action="store_true", help="seed the index, emit nothing")
    backfill.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    backfill.set_defaults(handler=_cmd_backfill)
    return parser


def _config(args) -> config_module.Config:
    return config_module.load(args.config, tuple(args.set))


def _cmd_dedup(args) -> int:
    from .runtime.feed import spawn_file_feed

    cfg = _config(args)
    spec = InputSpec.from_section(cfg.input)
    for path in args.inputs:
        if path != "-" and not os.path.isfile(path):
            raise ConfigError(f"input {path!r} does not exist (or is not a file)")
    spawned = spawn_file_feed(cfg, args.inputs)  # boots while this process imports the engine and opens the index
    try:
        from .engine.engine import Engine
        from .ops.progress import Progress
        from .runtime.offline import dedup_files
        from .runtime.source import FileSource

        with Engine(cfg, args.state) as engine:
            progress = Progress(FileSource(args.inputs).total_bytes(), enabled=args.progress)
            summary = dedup_files(engine, args.inputs, spec, args.out, args.decisions, cfg.worker.batch_size,
                                  args.restart, progress, cfg.worker.prepare_processes, spawned, args.learn_first)
    finally:
        if spawned is not None:
            spawned.close()
    out = sys.stderr if "-" in (args.out, args.decisions) else sys.stdout
    print("\n".join(summary.lines()), file=out)
    return EXIT_OK


def _cmd_sample(args) -> int:
    from .core import corpus, webcrawl

    if args.kind == "web":
        documents, write = webcrawl.generate_web(args.pages, args.sites, args.seed, args.prose), webcrawl.write_web_jsonl
        made = f"{args.pages:,} pages of {args.sites} sites ({args.prose} prose)"
    elif args.kind == "hot-keys":
        documents, write = corpus.hot_keys(args.documents, args.seed), corpus.write_jsonl
        made = f"{len(documents):,} documents filled into boilerplate templates"
    else:
        documents, write = corpus.generate(args.articles, args.seed), corpus.write_jsonl
        made = f"{len(documents):,} documents from {args.articles:,} articles"
    if args.out == "-":
        write(documents, sys.stdout)
    else:
        with open(args.out, "w", encoding="utf-8") as handle:
            write(documents, handle)
        print(f"wrote {made} to {args.out}", file=sys.stderr)
    return EXIT_OK


def _cmd_params(args) -> int:
    from .core.lsh import approx_threshold, band_hits, optimal_params, recall_params, s_curve

    if not 0 < args.threshold < 1:
        raise ConfigError(f"--threshold must be between 0 and 1, got {args.threshold}")
    if args.bands:
        if not args.rows or args.bands * args.rows > args.num_perm or not 1 <= args.min_shared <= args.bands:
            raise ConfigError("--bands needs --rows, bands x rows at most --num-perm, 1 <= --min-shared <= bands")
        bands, rows, shared, rule = args.bands, args.rows, args.min_shared, "given"
    elif args.weights:
        (bands, rows), shared = optimal_params(args.threshold, args.num_perm, *args.weights), 1
        rule = f"weights fp={args.weights[0]} fn={args.weights[1]}"
    else:
        if not 0 < args.recall < 1:
            raise ConfigError(f"--recall must be between 0 and 1, got {args.recall}")
        bands, rows, shared = recall_params(args.threshold, args.num_perm, args.recall)
        rule = f"recall {args.recall} at the threshold"
    print(f"threshold {args.threshold}  num_perm {args.num_perm}  chosen by {rule}")
    print(f"bands x rows: {bands} x {rows}, candidates share at least {shared} band{'s' * (shared > 1)}  "
          f"(uses {bands * rows} of {args.num_perm} values; S-curve midpoint ~{approx_threshold(bands, rows):.3f})")
    print(f"expected recall: a pair at the threshold becomes a candidate {s_curve(args.threshold, bands, rows, shared):.2%}"
          f" of the time; {bands} band entries a kept document (index bytes grow with them)")
    print("\nsimilarity  P(candidate)  per million kept documents this similar: band entries read, candidates")
    for s in (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0):
        marker = "  <- threshold" if abs(s - args.threshold) < 1e-9 else ""
        p = float(s_curve(s, bands, rows, shared))
        print(f"{s:>10.2f}  {p:>12.4f}  {band_hits(s, bands, rows) * 1e6:>14,.1f} {p * 1e6:>12,.1f}{marker}")
    return EXIT_OK


def _open(args, readonly: bool = True, cfg: Optional[config_module.Config] = None):
    """The index the command names, through the Python API (read-only unless it writes)."""
    from . import api

    return api.open(args.state, cfg or _config(args), readonly=readonly)


def _open_read(args):
    """The index to read: ``--shards``' sharded index (``api.ShardedIndex``), else ``_open``'s."""
    if not args.shards:
        return _open(args)
    from . import api

    if args.state:
        raise ConfigError("give --state (one index) or --shards (every vshard of a sharded deployment), not both")
    folders = [folder for given in args.shards for folder in given.split(",") if folder]
    return api.open_shards(folders, _config(args))


def _cmd_stats(args) -> int:
    if args.shards:
        return _print_sharded_stats(args)
    with _open(args) as index:
        stats = index.stats()
        min_sites = index.engine.template_settings.min_sites
    used, map_size = stats["map_used_bytes"], stats["map_size_bytes"]
    positions = stats["positions"]
    if args.json:
        print(json.dumps(stats, indent=2, sort_keys=True))
        return EXIT_OK
    for key in ("path", "documents", "clusters", "duplicates", "exact_duplicates"):
        print(f"{key:<18} {stats[key]:,}" if isinstance(stats[key], int) else f"{key:<18} {stats[key]}")
    print(f"{'duplicate_rate':<18} {stats['duplicate_rate']:.2%}")
    print(f"{'index_bytes':<18} {stats['index_bytes']:,}")
    print(f"{'map_use':<18} {used:,} of {map_size:,} bytes ({used / map_size:.1%})")
    print(f"{'fingerprint':<18} {stats['fingerprint']}")
    learned = stats["templates"]
    if learned["enabled"]:
        print(f"{'templates':<18} {learned['sites']:,} sites ({learned['settled']:,} settled), "
              f"{learned['template_shingles']:,} template shingles, {learned['shared_template_shingles']:,} "
              f"shared by {min_sites}+ sites")
        for site in learned["largest"]:
            print(f"{'  site':<18} {site['host'] or '(no URL)'}: {site['pages']:,} pages, "
                  f"{site['template_shingles']:,} template shingles{'' if site['settled'] else ', learning'}")
    for name, value in sorted(positions.items()):
        print(f"{'position':<18} {name} {json.dumps(value, sort_keys=True)}")
    return EXIT_OK


def _print_sharded_stats(args) -> int:
    with _open_read(args) as shards:
        stats = shards.stats()
    if args.json:
        print(json.dumps(stats, indent=2, sort_keys=True))
        return EXIT_OK
    print(f"{'vshards':<18} {stats['count']}")
    for key in ("documents", "clusters", "duplicates"):
        print(f"{key:<18} {stats[key]:,}")
    print(f"{'duplicate_rate':<18} {stats['duplicate_rate']:.2%}")
    print(f"{'index_bytes':<18} {stats['index_bytes']:,}")
    print(f"{'fingerprint':<18} {stats['fingerprint']}")
    for number, vshard in enumerate(stats["vshards"]):
        print(f"{f'vshard {number}':<18} {_vshard_line(vshard)}")
    return EXIT_OK


def _vshard_line(vshard: dict) -> str:
    """One vshard's figures in ``stats --shards``: its documents (home), its keys' places (owner), its bytes,
    and its last commit (epochs, and the host's input positions)."""
    committed = vshard["committed"]
    return (f"{vshard['path']}: {vshard['documents']:,} documents, {vshard['kept']:,} kept, {vshard['places']:,} "
            f"places, {vshard['index_bytes']:,} bytes, {committed['epochs_done']:,} epochs committed "
            f"{json.dumps(committed['meta'], sort_keys=True)}")


def _cmd_check(args) -> int:
    if args.fix:
        with _open(args, readonly=False) as index:
            before = index.check()
            result = index.engine.rebuild()
            print(f"rebuilt the lookup tables from {result['documents']:,} records "
                  f"({len(before.problems) + before.more} problems before); counters changed: "
                  f"{result['counters_changed'] or 'none'}")
            report = index.check()
    else:
        with _open(args) as index:
            report = index.check()
    for problem in report.problems:
        print(f"problem: {problem}")
    if report.more:
        print(f"... and {report.more} more problems")
    verdict = "consistent" if report.ok else "INCONSISTENT"
    print(f"{verdict}: {report.documents:,} documents, {report.kept:,} kept, {report.band_entries:,} band entries "
          f"({report.places:,} of them duplicates' places)")
    return EXIT_OK if report.ok else EXIT_PROBLEMS


def _cmd_query(args) -> int:
    if args.site:
        return _print_site(args)
    if args.file:
        with (sys.stdin if args.file == "-" else open(args.file, encoding="utf-8")) as handle:
            text = handle.read()
    else:
        text = args.text
    with _open_read(args) as index:
        matches = index.query(text, min_similarity=args.min_similarity, limit=args.limit)
    if args.json:
        print(json.dumps([{**m.as_dict(), "relation": m.relation} for m in matches], indent=2))
        return EXIT_OK
    if not matches:
        print("no near-duplicates in the index")
    for m in matches:
        kind = "exact copy" if m.exact else ("kept" if m.kept else "duplicate")
        if m.containment is not None:
            kind = f"holds {m.containment:.3f} of the text (the text is an excerpt of it)"
        print(f"{m.similarity:.3f}  {m.id}  cluster={m.cluster}  {kind}  source={'/'.join(map(str, m.source))}")
    return EXIT_OK


def _print_site(args) -> int:
    with _open_read(args) as index:
        site = index.sites(args.site)
    if args.json:
        print(json.dumps(site, indent=2))
        return EXIT_OK
    state = "settled" if site["settled"] else f"learning ({site['sampled']} pages sampled)"
    print(f"site {site['host'] or '(pages without a URL)'}: {site['pages']:,} new pages, {state}, "
          f"template of {site['template_shingles']:,} shingles")
    return EXIT_OK


def _cmd_cluster(args) -> int:
    with _open_read(args) as index:
        view = index.cluster(args.id, limit=args.limit or None)
    if args.json:
        print(json.dumps(view.as_dict(), indent=2))
        return EXIT_OK
    rep = view.representative
    print(f"cluster {rep['id']}: {view.members_total + 1} documents"
          + (f" (asked about member {view.asked})" if view.asked else ""))
    print(f"  representative  {rep['id']}  source={'/'.join(map(str, rep['source']))}"
          + ("  EXPIRED" if rep["expired"] else ""))
    for m in view.members:
        similarity = f"{m['similarity']:.3f}" if m["similarity"] is not None else "-"
        part = f"  (excerpt: {m['containment']:.3f} contained)" if m["relation"] == "excerpt" else ""
        print(f"  member {similarity}  {m['id']}{'  (exact copy)' if m['exact'] else ''}{part}  matched={m['matched']}"
              f"  source={'/'.join(map(str, m['source']))}")
    if view.members_total > len(view.members):
        print(f"  ... and {view.members_total - len(view.members):,} later members (--limit N, 0 for all)")
    return EXIT_OK


def _cmd_explain(args) -> int:
    from .ops.explained import explanation_lines

    with _open_read(args) as index:
        if args.text_a is not None or args.text_b is not None:
            if args.texts:
                raise ConfigError("explain: give --texts, or --text-a/--text-b, not both")
            pair = index.explain(args.id, args.other)
            texts = {}
            if args.text_a is not None:
                texts[pair.a.id] = args.text_a
            if args.text_b is not None:
                if pair.b is None:
                    raise ConfigError(f"explain: {args.id!r} was kept, it has no match: name OTHER_ID with --text-b")
                texts[pair.b.id] = args.text_b
            explained = index.explain(args.id, args.other, texts=texts)
        else:
            explained = index.explain(args.id, args.other, texts=args.texts or None)
    if args.json:
        print(json.dumps(explained.as_dict(), indent=2))
        return EXIT_OK
    width = args.width or shutil.get_terminal_size((100, 24)).columns
    print("\n".join(explanation_lines(explained, width)))
    return EXIT_OK


def _cmd_report(args) -> int:
    import time

    from .engine.census import take_census
    from .ops.report import figure_class, write_report

    if args.top < 0 or args.members < 0:
        raise ConfigError("--top and --members must be 0 or more")
    figure_class()  # says how to install matplotlib before the index is read
    started = time.monotonic()
    with _open(args) as index:
        census = take_census(index.engine, args.top, args.members)
        options = ["--state", index.path] + (["--config", os.path.abspath(args.config)] if args.config else [])
    try:
        size = write_report(census, args.out, options)
    except OSError as exc:
        raise StreamdedupError(f"cannot write the report to {args.out!r}: {exc.strerror or exc}; "
                               "give --out a path in a folder you can write to") from None
    print(f"wrote {args.out} ({size:,} bytes): {census.documents:,} documents, {census.clusters:,} clusters, "
          f"{census.duplicate_rate:.2%} duplicates, in {time.monotonic() - started:.1f} s")
    return EXIT_OK


def _cmd_forget(args) -> int:
    from .errors import IndexLockedError
    from .store.housekeeping import ForgetRequests

    ids = list(args.ids)
    if args.file:
        with open(args.file, encoding="utf-8") as handle:
            ids += [line.strip() for line in handle if line.strip()]
    if not ids:
        raise ConfigError("forget: name at least one id, or --file with one id per line")
    cfg = _config(args)
    if cfg.shards.count:
        from .runtime.vshards.sign import queue_forget

        offset = queue_forget(cfg, ids)
        print(f"queued the forgetting of {len(ids)} id(s) at offset {offset} of {cfg.shards.signed_topic}; every "
              "vshard applies it there, in order with the documents (its host's log says `forgotten`)")
        return EXIT_OK
    try:
        with _open(args, readonly=False, cfg=cfg) as index:
            result = index.forget(ids).as_dict()
            how = "applied directly (no worker was running)"
    except IndexLockedError:
        from .engine.engine import index_settings

        requests = ForgetRequests(index_settings(cfg, args.state).path)
        name = requests.submit(ids)
        result = requests.wait(name, args.timeout)
        if result is None:
            print(f"streamdedup: the process writing the index did not apply the request within {args.timeout:.0f} s; "
                  f"it stays queued in {requests.folder} and will be applied between batches", file=sys.stderr)
            return EXIT_FAILED
        how = "applied by the running worker"
    print(f"forgot {len(result['forgotten'])} id(s), {result['dissolved']} cluster(s) dissolved "
          f"({result['released']} member(s) released); {how}")
    for doc_id in result["unknown"]:
        print(f"not in the index: {doc_id}")
    return EXIT_OK


def _cmd_backup(args) -> int:
    dest = os.path.abspath(args.dest)
    if os.path.exists(os.path.join(dest, "data.mdb")):
        raise ConfigError(f"{dest} already holds an index (data.mdb): choose an empty or new folder")
    os.makedirs(dest, exist_ok=True)
    documents = _backup_vshard(args, dest)
    if documents is None:
        with _open(args) as index:
            index.engine.index.backup(dest)
            with index.engine.index.read() as txn:
                documents = txn.counters["documents"]
    size = os.path.getsize(os.path.join(dest, "data.mdb"))
    print(f"copied {documents:,} documents to {dest}/data.mdb ({size:,} bytes, compacted)")
    return EXIT_OK


def _backup_vshard(args, dest: str) -> Optional[int]:
    """When ``--state`` is a vshard's folder (``vshard-N`` of a sharded deployment): its state copied to ``dest``
    in one read transaction (safe while its host runs), and its documents; None for any other folder."""
    from .engine.engine import index_settings
    from .store.vshardstate import StoredVShard, is_vshard_state

    path = index_settings(_config(args), args.state).path
    if not os.path.isfile(os.path.join(path, "data.mdb")) or not is_vshard_state(path):
        return None
    stored = StoredVShard(path)
    try:
        stored.index.backup(dest)
        with stored.index.read() as txn:
            return stored.sizes(txn)["documents"]
    finally:
        stored.close()


def _cmd_restore(args) -> int:
    from .runtime.restore import restore_backup, restore_from_topics

    if (args.backup is None) == (not args.from_topics):
        raise ConfigError("give either a BACKUP folder or --from-topics (when there is no backup), not both")
    cfg = _config(args)
    if args.from_topics:
        restored = restore_from_topics(cfg, args.state, args.replace)
    else:
        restored = restore_backup(cfg, args.state, args.backup, args.replace)
    print("\n".join(restored.lines()))
    return EXIT_OK


def _log(cfg: config_module.Config):
    """The log of the commands that talk to Kafka; kafka-python's warnings and errors go into it too."""
    from .ops.logs import Log, route_library_logs

    log = Log(cfg.log.format, cfg.log.level)
    route_library_logs(log)
    return log


def _cmd_run(args) -> int:
    cfg = _config(args)
    if args.role != "worker":
        return _run_role(args, cfg)
    if args.until_idle is not None or args.vshards is not None:
        raise ConfigError("--until-idle goes with --role sign, --vshards with --role vshards")
    spawned = _spawn_feed(cfg)
    try:
        from .runtime.worker import Stopper, run_worker

        log = _log(cfg)
        stopper = Stopper()
        stopper.install()
        stats = run_worker(cfg, args.state, args.until_caught_up, log, stopper, spawned)
    finally:
        if spawned is not None:
            spawned.close()
    s = stats.summary
    rate = s.total / s.seconds if s.seconds else 0.0
    log.info("stopped", documents=s.total, kept=s.outcomes["kept"], duplicate=s.outcomes["duplicate"],
             rejected=s.outcomes["rejected"], replayed=s.replayed, docs_per_s=round(rate, 1))
    return EXIT_OK


def _run_role(args, cfg) -> int:
    """``run --role sign`` or ``run --role vshards``: one process of a sharded deployment."""
    from .runtime.sessions import Stopper

    if cfg.shards.count < 1:
        raise ConfigError(f"--role {args.role} needs shards.count, the deployment's number of virtual shards (1 or "
                          "more)")
    log = _log(cfg)
    stopper = Stopper()
    stopper.install()
    if args.role == "vshards":
        return _run_vshards(args, cfg, log, stopper)
    if args.vshards is not None or args.until_caught_up:
        raise ConfigError("--role sign takes neither --vshards nor --until-caught-up (see --until-idle)")
    from .runtime.vshards.sign import run_signer

    run_signer(cfg, log, stopper, args.until_idle)
    return EXIT_OK


def _run_vshards(args, cfg, log, stopper) -> int:
    """``run --role vshards``: some of the virtual shards of a sharded deployment."""
    from .runtime.vshards.host import parse_vshards, run_vshards

    if args.until_idle is not None:
        raise ConfigError("--until-idle goes with --role sign (a vshards host stops with --until-caught-up)")
    numbers = parse_vshards(args.vshards, cfg.shards.count) if args.vshards else None
    stats = run_vshards(cfg, args.state or cfg.index.path, numbers, args.until_caught_up, log, stopper)
    s = stats.summary
    log.info("stopped", role="vshards", documents=s.total, kept=s.outcomes["kept"],
             duplicate=s.outcomes["duplicate"], rejected=s.outcomes["rejected"], replayed=s.replayed)
    return EXIT_OK


def _spawn_feed(cfg):
    """The worker's feed process, started first thing: its imports and connection overlap the worker's own."""
    if not cfg.worker.prepare_processes:
        return None
    from .runtime.feed import spawn_feed

    return spawn_feed(cfg, cfg.input.topics, cfg.kafka.group_id, cfg)


def _cmd_backfill(args) -> int:
    from datetime import datetime, timezone

    from .runtime.worker import Stopper, run_backfill

    cfg = _config(args)
    since = None
    if args.from_timestamp:
        try:
            moment = datetime.fromisoformat(args.from_timestamp)
        except ValueError:
            raise ConfigError(f"--from-timestamp {args.from_timestamp!r} is not an ISO 8601 time, "
                              "for example 2026-01-31T00:00:00Z") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        since = int(moment.timestamp() * 1000)
    stopper = Stopper()
    stopper.install()
    summary = run_backfill(cfg, args.state, args.topic, since, args.index_only, _log(cfg), stopper, args.progress)
    print("\n".join(summary.lines()))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
