"""A decision is a function of the input order and the settings alone.

Not of the batch size, of where a kill -9 and the resume cut the batches,
of the preparing processes, of when the recent keys are merged into the
tables, or of the band filter. The same holds for what site templates learn as pages arrive: a crawl of
sites whose navigation changes by section (repeated blocks learned in a
window of each site's recent pages) is cut the same ways. The corpus makes band keys hot (documents
filled into a few boilerplate templates, and near copies), and a small
``lsh.max_candidates`` makes the per-key limit bite on most of them: where
it bites, "the earliest kept documents of a key" must mean the same thing
in the batch, the recent mirror and the tables.
"""

from __future__ import annotations

import random

import pytest
from conftest import index_snapshot, run_cli

from streamdedup.core import corpus
from streamdedup.core.webcrawl import generate_web, write_web_jsonl
from streamdedup.store.index import Index, IndexSettings
from streamdedup.store.sites import load_site, site_summaries

pytestmark = pytest.mark.system  # every test here starts processes

DOCUMENTS = 1500

# (batch size, merge every, preparing processes, band filter MiB): each cuts the stream elsewhere
WAYS = {
    "one at a time": (1, 100000, 1, 16),
    "7, merged every 50": (7, 50, 1, 16),
    "700, merged every 333, prepared here": (700, 333, 0, 16),
    "2000, merged every 500, no band filter": (2000, 500, 1, 0),
}


@pytest.fixture(scope="module")
def hot_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("hot") / "hot.jsonl"
    with open(path, "w", encoding="utf-8") as handle:
        corpus.write_jsonl(corpus.hot_keys(DOCUMENTS, seed=5), handle)
    return path


def _settings(batch, merge_every, processes, filter_mb, max_candidates, cap="kept"):
    return ["--set", f"worker.batch_size={batch}", "--set", f"index.merge_every={merge_every}",
            "--set", f"worker.prepare_processes={processes}", "--set", f"index.band_filter_mb={filter_mb}",
            "--set", f"lsh.max_candidates={max_candidates}", "--set", f'lsh.cap="{cap}"']


def _dedup(folder, source, settings, **kw):
    folder.mkdir(exist_ok=True)
    return run_cli("dedup", str(source), "--state", str(folder / "state"), "--decisions",
                   str(folder / "decisions.jsonl"), "--out", str(folder / "clean.jsonl"), *settings, **kw)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, hot_file):
    """Per ``max_candidates`` (and ``lsh.cap``): the decisions of one run in batches of 100, merged every 100,000."""
    made = {}

    def of(max_candidates, cap="kept"):
        if (max_candidates, cap) not in made:
            folder = tmp_path_factory.mktemp(f"reference-{max_candidates}-{cap}")
            _dedup(folder, hot_file, _settings(100, 100000, 1, 16, max_candidates, cap))
            made[max_candidates, cap] = folder
        return made[max_candidates, cap]

    return of


@pytest.mark.parametrize("max_candidates", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("way", list(WAYS))
def test_decisions_do_not_depend_on_how_the_stream_is_cut(tmp_path, hot_file, reference, way, max_candidates):
    _dedup(tmp_path, hot_file, _settings(*WAYS[way], max_candidates))
    expected = reference(max_candidates)
    assert (tmp_path / "decisions.jsonl").read_bytes() == (expected / "decisions.jsonl").read_bytes()
    assert (tmp_path / "clean.jsonl").read_bytes() == (expected / "clean.jsonl").read_bytes()
    assert _decided(tmp_path / "state") == _decided(expected / "state")


@pytest.mark.parametrize("max_candidates", [1, 3])
@pytest.mark.parametrize("way", list(WAYS))
def test_with_the_cap_on_probes_decisions_do_not_depend_on_how_the_stream_is_cut_either(tmp_path, hot_file, reference,
                                                                                        way, max_candidates):
    """``lsh.cap = "probes"``: a duplicate's places, in the batch, the recent log and the tables alike."""
    _dedup(tmp_path, hot_file, _settings(*WAYS[way], max_candidates, "probes"))
    expected = reference(max_candidates, "probes")
    assert (tmp_path / "decisions.jsonl").read_bytes() == (expected / "decisions.jsonl").read_bytes()
    assert _decided(tmp_path / "state") == _decided(expected / "state")


def test_the_two_caps_decide_the_hot_corpus_differently(reference):
    """What the cap counts matters on this corpus (else the tests above could not tell them apart)."""
    assert (reference(1) / "decisions.jsonl").read_bytes() != (reference(1, "probes") / "decisions.jsonl").read_bytes()


def _decided(state) -> dict:
    """What the index decided, without where merges happened to leave its lookup entries."""
    snapshot = index_snapshot(state)
    return {"records": snapshot["records"],
            "counters": {k: v for k, v in snapshot["counters"].items()
                         if k not in ("merged_upto", "merging", "merge_upto", "merge_slices")}}


def test_the_hot_corpus_makes_the_limit_bite(reference):
    """The corpus is what the test needs: a limit of 1 and one of 5 decide it differently (were they the
    same, no batching could change anything either)."""
    assert (reference(1) / "decisions.jsonl").read_bytes() != (reference(5) / "decisions.jsonl").read_bytes()


@pytest.mark.parametrize("seed,cap", [(1, "kept"), (2, "kept"), (3, "kept"), (4, "probes"), (5, "probes")])
def test_killed_at_a_random_batch_and_resumed_with_other_batches_decides_as_one_run(tmp_path, hot_file, reference,
                                                                                     seed, cap):
    """kill -9 (the crash switch, at a random commit step of a random batch, or between the slices of a
    merge), then a resume that cuts the rest of the stream into batches of another size; with
    ``lsh.cap = "probes"`` the duplicates' places come back from the recent log, and the index checks."""
    rng = random.Random(seed)
    max_candidates = rng.randint(1, 5)
    batch = rng.choice([7, 50, 300])
    step = rng.choice(["file-decided", "file-written", "file-committed", "merge-slice"])
    nth = rng.randint(1, 5) if step == "merge-slice" else rng.randint(2, DOCUMENTS // batch - 1)
    crashed = _dedup(tmp_path, hot_file, _settings(batch, 200, 1, 16, max_candidates, cap), check=False,
                     env={"STREAMDEDUP_TEST_CRASH_AT": f"{step}:{nth}"})
    assert crashed.returncode == 137, crashed.stderr.decode(errors="replace")
    _dedup(tmp_path, hot_file, _settings(rng.choice([1, 13, 2000]), 450, 0, 16, max_candidates, cap))
    expected = reference(max_candidates, cap)
    assert (tmp_path / "decisions.jsonl").read_bytes() == (expected / "decisions.jsonl").read_bytes()
    assert _decided(tmp_path / "state") == _decided(expected / "state")
    checked = run_cli("check", "--state", str(tmp_path / "state"), "--set", f'lsh.cap="{cap}"')
    assert b"consistent:" in checked.stdout


BLOCKS = ["--set", "templates.window=16"]  # repeated blocks (off by default)


@pytest.fixture(scope="module")
def sectioned_file(tmp_path_factory):
    """A crawl of 12 sites whose navigation changes by section (``core.webcrawl``, ``navigation="sections"``)."""
    path = tmp_path_factory.mktemp("sectioned") / "sectioned.jsonl"
    with open(path, "w", encoding="utf-8") as handle:
        write_web_jsonl(generate_web(1200, 12, 5, navigation="sections"), handle)
    return path


@pytest.fixture(scope="module")
def sectioned_reference(tmp_path_factory, sectioned_file):
    folder = tmp_path_factory.mktemp("sectioned-reference")
    _dedup(folder, sectioned_file, _settings(100, 100000, 1, 16, 100) + BLOCKS)
    return folder


@pytest.mark.parametrize("way", list(WAYS))
def test_what_sectioned_sites_teach_does_not_depend_on_how_the_stream_is_cut(tmp_path, sectioned_file,
                                                                              sectioned_reference, way):
    """Repeated blocks (a section's navigation) are learned page by page, whatever the batches."""
    _dedup(tmp_path, sectioned_file, _settings(*WAYS[way], 100) + BLOCKS)
    assert (tmp_path / "decisions.jsonl").read_bytes() == (sectioned_reference / "decisions.jsonl").read_bytes()
    assert (tmp_path / "clean.jsonl").read_bytes() == (sectioned_reference / "clean.jsonl").read_bytes()
    assert _decided(tmp_path / "state") == _decided(sectioned_reference / "state")


@pytest.mark.parametrize("step,nth", [("file-decided", 4), ("file-committed", 9)])
def test_sectioned_sites_killed_and_resumed_with_other_batches_decide_as_one_run(tmp_path, sectioned_file,
                                                                                 sectioned_reference, step, nth):
    """kill -9 in the middle of a batch, then a resume in batches of another size: the sites' windows and
    blocks come back from the index as the last committed batch left them."""
    crashed = _dedup(tmp_path, sectioned_file, _settings(50, 200, 1, 16, 100) + BLOCKS, check=False,
                     env={"STREAMDEDUP_TEST_CRASH_AT": f"{step}:{nth}"})
    assert crashed.returncode == 137, crashed.stderr.decode(errors="replace")
    _dedup(tmp_path, sectioned_file, _settings(13, 450, 0, 16, 100) + BLOCKS)
    assert (tmp_path / "decisions.jsonl").read_bytes() == (sectioned_reference / "decisions.jsonl").read_bytes()
    assert _decided(tmp_path / "state") == _decided(sectioned_reference / "state")


def test_the_sectioned_crawl_learns_blocks_and_finds_duplicates(sectioned_reference):
    """The crawl is what the tests above need: blocks learned, and duplicates among the decisions."""
    decided = (sectioned_reference / "decisions.jsonl").read_text().splitlines()
    assert sum('"duplicate"' in line for line in decided) > 100
    with Index(IndexSettings(path=str(sectioned_reference / "state")), None, readonly=True) as index:
        with index.read() as txn:
            blocks = [len(load_site(txn, site["site"]).blocks) for site in site_summaries(txn)]
    assert len(blocks) == 12 and all(blocks)


REPEATS = ["--set", "templates.repeats=true"]  # what each site repeats (on by default; said for clarity)


@pytest.fixture(scope="module")
def repeats_reference(tmp_path_factory, sectioned_file):
    folder = tmp_path_factory.mktemp("repeats-reference")
    _dedup(folder, sectioned_file, _settings(100, 100000, 1, 16, 100) + REPEATS)
    return folder


@pytest.mark.parametrize("way", list(WAYS))
def test_what_sites_repeat_does_not_depend_on_how_the_stream_is_cut(tmp_path, sectioned_file, repeats_reference,
                                                                    way):
    """What each site repeats is counted page by page, and a pair compared on it as of its later page."""
    _dedup(tmp_path, sectioned_file, _settings(*WAYS[way], 100) + REPEATS)
    assert (tmp_path / "decisions.jsonl").read_bytes() == (repeats_reference / "decisions.jsonl").read_bytes()
    assert _decided(tmp_path / "state") == _decided(repeats_reference / "state")


def test_sites_counting_repeats_killed_and_resumed_with_other_batches_decide_as_one_run(tmp_path, sectioned_file,
                                                                                        repeats_reference):
    crashed = _dedup(tmp_path, sectioned_file, _settings(50, 200, 1, 16, 100) + REPEATS, check=False,
                     env={"STREAMDEDUP_TEST_CRASH_AT": "file-decided:4"})
    assert crashed.returncode == 137, crashed.stderr.decode(errors="replace")
    _dedup(tmp_path, sectioned_file, _settings(13, 450, 0, 16, 100) + REPEATS)
    assert (tmp_path / "decisions.jsonl").read_bytes() == (repeats_reference / "decisions.jsonl").read_bytes()
