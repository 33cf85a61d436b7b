"""``streamdedup explain`` and ``Index.explain`` on indexes the ``dedup`` command built from the sample crawl."""

from __future__ import annotations

import json

import pytest

import streamdedup
from conftest import read_jsonl, run_cli
from streamdedup.core.shingle import normalize
from streamdedup.errors import UnknownDocumentError

pytestmark = pytest.mark.system  # every test here starts processes


@pytest.fixture(scope="module")
def decided(tmp_path_factory, crawl_file):
    """An index of the sample crawl, its decisions by id, and its texts by id."""
    work = tmp_path_factory.mktemp("explain")
    run_cli("dedup", str(crawl_file), "--state", str(work / "state"), "--decisions", str(work / "d.jsonl"))
    decisions = {row["id"]: row for row in read_jsonl(work / "d.jsonl")}
    texts = {row["id"]: row["text"] for row in read_jsonl(crawl_file)}
    return work / "state", decisions, texts


def _near(decisions: dict) -> list[dict]:
    return [d for d in decisions.values() if d["relation"] == "near"]


def _explained(state, *args: str) -> dict:
    return json.loads(run_cli("explain", *args, "--state", str(state), "--json").stdout)


def _runs(words: str, text: str) -> bool:
    """Whether ``words`` (normalized) occur as one run of ``text``'s normalized words."""
    return f" {words} " in f" {normalize(text)} "


def _in_context(passages: list[dict], at: int, side: str) -> str:
    """Passage ``at``'s words on ``side`` with the word before and the word after them on that side."""
    before = " ".join(p[side] for p in passages[:at] if p[side]).split()[-1:]
    after = " ".join(p[side] for p in passages[at + 1:] if p[side]).split()[:1]
    return " ".join(before + [passages[at][side]] + after)


def test_a_near_duplicate_names_its_match_the_decided_similarity_and_passages_that_differ(decided, crawl_file):
    state, decisions, texts = decided
    checked = 0
    with streamdedup.open(state, readonly=True) as index:
        explained = {d["id"]: index.explain(d["id"], texts=crawl_file).as_dict() for d in _near(decisions)[:40]}
    for decision in _near(decisions)[:3]:  # the command says the same
        assert _explained(state, decision["id"], "--texts", str(crawl_file)) == explained[decision["id"]]
    for decision in _near(decisions)[:40]:
        got = explained[decision["id"]]
        assert got["matched"] == decision["matched"] == got["b"]["id"] and got["b_is_match"]
        assert got["similarity"] == decision["similarity"] == round(got["decided_similarity"], 6)
        assert len(got["shared_bands"]) >= got["min_shared"]  # it was a candidate through its bands
        a, b = texts[decision["id"]], texts[decision["matched"]]
        passages = got["passages"]
        assert " ".join(p["a"] for p in passages if p["a"]) == normalize(a)  # the passages are the two texts
        assert " ".join(p["b"] for p in passages if p["b"]) == normalize(b)
        differing = [at for at, p in enumerate(passages) if p["kind"] != "same"]
        assert all(p["a"] == p["b"] for p in passages if p["kind"] == "same")
        assert differing and all(passages[at]["a"] != passages[at]["b"] for at in differing)
        # some difference, with a word of context on each side, is nowhere in the other text
        assert any(not _runs(_in_context(passages, at, side), other) for at in differing
                   for side, other in (("a", b), ("b", a)) if passages[at][side]), decision["id"]
        checked += len(differing)
    assert checked > 20  # the crawl's near copies really differ in places


def test_without_texts_it_says_what_the_index_knows_and_how_to_get_the_rest(decided):
    state, decisions, _ = decided
    decision = _near(decisions)[0]
    got = _explained(state, decision["id"])
    assert got["matched"] == decision["matched"] and round(got["decided_similarity"], 6) == decision["similarity"]
    assert got["similarity"] is None and got["passages"] is None  # a duplicate's shingles are not stored
    assert any("--texts" in note for note in got["notes"])
    printed = run_cli("explain", decision["id"], "--state", str(state)).stdout.decode()
    assert f"a near duplicate of {decision['matched']}" in printed and "--texts FILE.jsonl" in printed


def test_two_kept_documents_are_compared_from_their_stored_shingles(decided):
    state, decisions, texts = decided
    kept = [d["id"] for d in decisions.values() if d["status"] == "kept"]
    near = _near(decisions)[0]
    got = _explained(state, near["matched"], kept[0] if kept[0] != near["matched"] else kept[1])
    assert got["a"]["shingles_from"] == got["b"]["shingles_from"] == "index"
    assert got["similarity"] < got["threshold"]  # both kept: neither was a duplicate of the other
    with streamdedup.open(state, readonly=True) as index:
        match = index.explain(near["id"], texts={near["id"]: texts[near["id"]]})
    assert match.similarity == near["similarity"] and match.a.shingles_from == "text"
    assert match.b.shingles_from == "index" and match.passages is None  # the match's text was not given


def test_texts_given_on_the_command_line_and_a_wrong_text_is_not_used(decided):
    state, decisions, texts = decided
    decision = _near(decisions)[1]
    a, b = texts[decision["id"]], texts[decision["matched"]]
    got = _explained(state, decision["id"], "--text-a", a, "--text-b", b)
    assert got["similarity"] == decision["similarity"] and got["passages"]
    wrong = _explained(state, decision["id"], "--text-a", b + " something else", "--text-b", b)
    assert wrong["similarity"] is None and any("not the text the index decided" in n for n in wrong["notes"])


def test_the_terminal_form_shows_both_sides_of_a_difference(decided, crawl_file):
    state, decisions, _ = decided
    decision = _near(decisions)[2]
    printed = run_cli("explain", decision["id"], "--texts", str(crawl_file), "--state", str(state),
                      "--width", "100").stdout.decode()
    lines = printed.splitlines()
    assert lines[0].startswith(f"{decision['id']}: duplicate, a near duplicate of {decision['matched']}")
    assert f"similarity {decision['similarity']:.6f}" in printed and "passages (normalized words" in printed
    differing = [line for line in lines if line[:1] in "~-+"]
    assert differing and all(len(line) <= 100 for line in lines if line[:1] in "~-+ " and " | " in line)


def test_an_unknown_id_is_a_clear_error(decided):
    state, _, _ = decided
    result = run_cli("explain", "no-such-document", "--state", str(state), check=False)
    assert result.returncode == 1
    assert "no document with id 'no-such-document' in the index" in result.stderr.decode()
    with streamdedup.open(state, readonly=True) as index, pytest.raises(UnknownDocumentError):
        index.explain("no-such-document")


def test_a_kept_document_alone_says_so(decided):
    state, decisions, _ = decided
    representative = _near(decisions)[0]["matched"]
    got = _explained(state, representative)
    assert got["a"]["status"] == "kept" and got["b"] is None and got["members"] >= 1
    assert "kept: no earlier kept document" in got["notes"][0]
