"""One virtual shard: the home of its documents, the owner of its keys, and what it does at each stage of an epoch.

An epoch is a stretch of the input in its order (of one partition, or of
each partition in turn). Every record of it has its place in the
deployment's order, which is its serial if it is a new document (a replay
or a rejected record leaves its number unused), and is sent to its home
with it. Eight kinds of message go between vshards in an epoch; a vshard
runs a stage once the message of every vshard for it is in, so the order
messages arrive in changes nothing, and a second copy of a message is
dropped:

============  =====================  ==================================================================
stage         from -> to             carries, and what the receiver does with it
============  =====================  ==================================================================
``contents``  home -> content owner  the contents of the home's new documents (all but replays): the
                                     owner answers the first document of each
``twins``     content owner -> home  each content's first document, stored or earlier in the epoch:
                                     the home's exact copies are found; the other new documents probe
``probes``    home -> band owner     the band slots of the probing documents: the owner gives each
                                     key's places to its first ``max_candidates`` probers
``places``    band owner -> home     the holders of a key's places before each prober: the home sums
                                     the bands each candidate shares
``verify``    home(d) -> home(c)     d's shingles and its candidates living at c's home, and the
                                     stored twins there: Jaccard where the candidate's shingles are
``verified``  home(c) -> home(d)     the matches at or above the threshold, the candidates that are
                                     duplicates' places (no shingles), their names, the twins' records
``linked``    home -> every vshard   what decides each document linked to another of the epoch (one it
                                     waits for, or one waiting for it): each vshard decides its own
                                     documents and those of others they wait for, and commits
``kept``      home -> band owner     which of its probers past a key's cap were kept: filed after the
                                     key's places (one index files a kept document under every key)
============  =====================  ==================================================================

A forget order is an epoch of its own (``forget``: ``forgotten``, then
``released``).

Decisions are ``decide.decide_together``'s on the evidence gathered so
(``evidence.Gathered``), the single worker's with ``lsh.cap = "probes"``: a
key's places go to its first probers whatever they are then decided, so a
key's owner answers before the decisions of the epoch are known, and only
the documents linked within the epoch wait for each other.

A vshard keeps its state (records, shingles, ids and members at home;
places and each content's documents for the keys it owns) in memory
(``stores.MemoryState``) or, given a folder, in LMDB
(``store.vshardstate.LmdbState``), through the same methods. Each epoch's
changes are one LMDB transaction, committed when the caller says so
(``commit``, with its input positions), and the next epoch may not start
before: a vshard that dies before its commit comes back as of the epoch
before, and given the same records and messages again it sends the same
messages, byte for byte, and decides the same (nothing else it holds
changes what it does: its cache of closed keys is kept with the state).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import msgpack
import numpy as np

from ...config import Config
from ...core.lsh import band_slots
from ...core.prepare import PreparedBatch, prepare, prepare_in_pieces
from ...core.records import Decision, Document, Item, Source, id_key
from ...core.signing import band_keys_of
from ...core.shingle import ShingleBatch
from ...core.verify import jaccard
from ...errors import ConfigError
from ...store.candidates import Hits, ranges
from ...store.index import DocRecord
from ...store.vshardstate import LmdbState
from ..decide import decide_together
from ...core.memory import collector_paused
from ..evidence import Evidence, Gathered, replay_of, twin_of
from ..settings import DedupSettings
from .message import Message
from .placement import homes_of, owners_of_contents, owners_of_slots
from .stores import ClosedKeys, MemoryState, holder, holder_homes, holder_serials

__all__ = ["Message", "VShard", "check_supported"]

_ELSEWHERE = Source("vshard", -1, -1)  # another home's document decided here: never written, never sent out
_NONE = np.zeros(0, dtype=np.int64)
_OFFSET_BITS = 24  # of a serial's offset in its epoch, beside a band slot's 40 in one sort key (``_slot_then_offset``)


def check_supported(config: Config) -> None:
    """Refuse, naming it, a setting the key-split deployment cannot run yet."""
    refused = []
    if config.lsh.cap != "probes":
        refused.append('lsh.cap = "probes" is required (a key\'s owner answers before the epoch is decided)')
    if config.templates.enabled:
        refused.append("site templates (templates.enabled) are not sharded by key yet: set templates.enabled = false")
    if config.excerpts.enabled:
        refused.append("excerpts (excerpts.enabled) are not sharded by key yet: set excerpts.enabled = false")
    if config.index.retention_days > 0:
        refused.append("retention (index.retention_days) is not sharded by key yet: set it to 0")
    if refused:
        raise ConfigError("a deployment with band tables split by key: " + "; ".join(refused))


@dataclass
class _Epoch:
    """What a vshard knows of one epoch in flight (documents named by serial)."""

    number: int
    now: float
    first: int  # the epoch's first serial
    end: int  # the next epoch's
    batch: PreparedBatch  # the home's records of the epoch
    documents: list[Document]  # of each row
    item_serials: list[int]  # each item's place in the order
    replays: dict  # row -> the stored decision it replays
    new: dict  # serial -> row, of the new documents (not replays)
    twins: dict = field(default_factory=dict)  # serial -> (twin serial, its home, stored)
    needed: set = field(default_factory=set)  # own serials another document of the epoch waits for
    contents: dict = field(default_factory=dict)  # owned content -> [serial, home, True] of each new document
    placed: tuple = (_NONE, _NONE)  # (slots, holders): places taken here under owned keys, sorted
    probes: tuple = (_NONE, _NONE)  # (slots, serials) this home asked owners about
    closed_probes: list = field(default_factory=list)  # (slot, serials, holders) of probes of closed keys
    beyond: list = field(default_factory=list)  # (slots, serials) of own probers past a key's cap
    candidates: dict = field(default_factory=dict)  # serial -> (serials, shared): its strong ones, ascending
    matches: dict = field(default_factory=dict)  # serial -> [(serial, Jaccard)]
    unkept: set = field(default_factory=set)
    names: dict = field(default_factory=dict)
    twin_records: dict = field(default_factory=dict)  # serial -> [serial, cluster, cluster id, id] (stored)
    waits: dict = field(default_factory=dict)  # serial -> ``waits_for`` it, once its evidence is gathered (if any)
    kept: set = field(default_factory=set)  # own serials kept (once committed)

    def waits_for(self, serial: int) -> list[int]:
        """The documents of the epoch a new document's decision depends on: its candidates of the epoch, and
        the first document of its content if that is of the epoch."""
        waits = []
        twin = self.twins.get(serial)
        if twin is not None and not twin[2]:
            waits.append(twin[0])
        found = self.candidates.get(serial)
        if found is not None and int(found[0][-1]) >= self.first:
            waits += [candidate for candidate in found[0].tolist() if candidate >= self.first]
        return waits


class VShard:
    """Virtual shard ``number`` of ``count``: ``slice`` starts an epoch, ``receive`` takes every message,
    ``commit`` keeps the epoch once it is done here (``epochs_done`` has grown).

    Its state is in memory, or with ``path`` in the LMDB environment there (made if need be, else read as
    of its last commit; ``sync``: each commit's data flushed, so power loss undoes the last commit at most),
    which refuses another vshard's number, count or settings."""

    def __init__(self, number: int, count: int, settings: DedupSettings, path: Optional[str] = None,
                 sync: bool = True):
        if settings.signing.cap != "probes":
            raise ConfigError('a deployment with band tables split by key needs lsh.cap = "probes"')
        if settings.signing.bands > 256:  # a band's number crosses the network in a byte (``_slots``)
            raise ConfigError(f"a deployment with band tables split by key takes at most 256 bands, not "
                              f"{settings.signing.bands}: lower lsh.bands")
        self.number, self.count, self.settings, self.signing = number, count, settings, settings.signing
        # home: records, shingles, ids, members; owner: places, and content -> [serial, home, still in a
        # cluster] of every document with it, in order: the first is its twin's, the next is first once that
        # one is forgotten (as in one index's content table)
        self.state = MemoryState() if path is None else LmdbState(path, self.identity(), self.signing, sync)
        self.closed = ClosedKeys()  # home: closed keys it probes, answered here
        self.closed.add(self.state.closed_keys())
        self.linked_rows = 0  # documents sent to every vshard, linked to another of their epoch
        self.decided: dict[int, list[Decision]] = {}  # epoch -> decisions of the home's items, in order
        self.epochs_done = self.state.epochs_done  # epochs are numbered from 0 and decided one after the other
        self._inbox: dict[tuple[int, str], dict[int, bytes]] = {}
        self._stages_done: dict[int, set[str]] = {}
        self._epochs: dict[int, _Epoch] = {}

    def identity(self) -> dict:
        """What a vshard's stored state must have been made by: its number and count, its settings."""
        return {"number": self.number, "count": self.count, "settings": self.signing.fingerprint(),
                "threshold": self.settings.threshold, "max_candidates": self.settings.max_candidates}

    # -- the ways in --------------------------------------------------------------------------------------

    def slice(self, epoch: int, items: list[Item], serials: list[int], span: tuple[int, int],
              now: float) -> list[Message]:
        """Start ``epoch`` (serials ``span``) with the records it holds that this vshard is home to, decoded, in
        order, and the place of each in the deployment's order: the home prepares them (``core.prepare``, in
        pieces), so a signing process sends each home its records' bytes alone."""
        with collector_paused():
            batch = prepare_in_pieces(items, self.signing)
        return self.slice_prepared(epoch, batch, serials, span, now)

    def slice_prepared(self, epoch: int, batch: PreparedBatch, serials: list[int], span: tuple[int, int],
                       now: float) -> list[Message]:
        """``slice`` of records prepared already (``core.prepare``, this vshard's signing settings): each item of
        ``batch`` with its place in the order."""
        self._starting(epoch, "epoch")
        with collector_paused():
            return self._sliced(epoch, batch, serials, span, now)

    def _starting(self, epoch: int, kind: str) -> None:
        """Refuse an epoch out of turn; begin the state's transaction for it."""
        if epoch != self.epochs_done or self._epochs:
            raise ValueError(f"vshard {self.number}: {kind} {epoch} started before epoch {self.epochs_done} was "
                             "decided here (epochs are decided one after the other)")
        if self.state.epochs_done != self.epochs_done:
            raise ValueError(f"vshard {self.number}: {kind} {epoch} started before epoch {epoch - 1} was "
                             "committed: call commit(meta) once an epoch is done, before the next one starts")
        self.state.begin()

    def commit(self, meta: dict) -> None:
        """Keep the epoch done here, with ``meta`` (the caller's input positions: str -> JSON-able), in one
        LMDB transaction (in memory: the metadata alone)."""
        if self._epochs or self.state.epochs_done == self.epochs_done:
            raise ValueError(f"vshard {self.number}: nothing to commit (epoch {self.epochs_done} is "
                             f"{'in flight' if self._epochs else 'not started'}): commit once an epoch is done")
        self.state.commit(self.epochs_done, meta)

    def meta(self) -> dict:
        """The metadata of the last commit ({} before the first)."""
        return self.state.meta()

    def close(self) -> None:
        """Close the state; an epoch done but not committed is thrown away, as when the process dies."""
        self.state.close()

    def _sliced(self, epoch: int, batch: PreparedBatch, serials: list[int], span: tuple[int, int],
                now: float) -> list[Message]:
        """``batch`` holds one item for each record (a blank one is a Rejected)."""
        if batch.id_keys and (homes_of(batch.id_keys, self.count) != self.number).any():
            raise ValueError(f"vshard {self.number} was given documents it is not home to")
        item_serials = list(serials)
        row_serials = [serial for serial, row in zip(item_serials, batch.row) if row >= 0]
        documents = [item for item in batch.items if isinstance(item, Document)]
        replays = self._stored_replays(batch, documents)
        new = {row_serials[row]: row for row in self._new_rows(batch, documents, replays)}
        e = self._epochs[epoch] = _Epoch(epoch, now, span[0], span[1], batch, documents, item_serials, replays, new)
        serials = np.fromiter(new, dtype=np.int64, count=len(new))
        contents = [batch.contents[row] for row in new.values()]
        owners = owners_of_contents(contents, self.count) if contents else _NONE
        parts = _split_by(owners, self.count, serials, np.arange(len(contents)))
        return [self._to(e, "contents", w, {"serials": _ints(owned), "contents": [contents[i] for i in at.tolist()]})
                for w, (owned, at) in enumerate(parts)]

    def receive(self, message: Message) -> list[Message]:
        """Take one message; once every vshard's is in for its stage, run the stage: the messages it sends."""
        with collector_paused():  # a stage makes many small containers, none in cycles (``collector_paused``)
            return self._received(message)

    def _received(self, message: Message) -> list[Message]:
        if message.epoch < self.epochs_done or message.stage in self._stages_done.get(message.epoch, ()):
            return []  # a copy of a message whose stage has run
        box = self._inbox.setdefault((message.epoch, message.stage), {})
        if message.sender in box:
            return []
        box[message.sender] = message.body
        if len(box) < self.count:
            return []
        del self._inbox[(message.epoch, message.stage)]
        self._stages_done.setdefault(message.epoch, set()).add(message.stage)
        bodies = [msgpack.unpackb(box[v], strict_map_key=False) for v in range(self.count)]
        return getattr(self, "_on_" + message.stage)(self._epochs[message.epoch], bodies)

    # -- the stages, in order ----------------------------------------------------------------------------

    def _on_contents(self, e: _Epoch, bodies: list[dict]) -> list[Message]:
        """As a content owner: answer each new document with its content's first document."""
        serials = np.concatenate([_from_ints(body["serials"]) for body in bodies])
        homes = np.repeat(np.arange(self.count), [len(body["contents"]) for body in bodies])
        order = np.argsort(serials, kind="stable")  # the deployment's order (a serial is asked once)
        every = [content for body in bodies for content in body["contents"]]
        contents = [every[at] for at in order.tolist()]
        answers: list[list] = [[] for _ in range(self.count)]
        needed: list[list] = [[] for _ in range(self.count)]
        for serial, content, home, first in zip(serials[order].tolist(), contents, homes[order].tolist(),
                                                self.state.firsts_of(contents)):
            seen = e.contents.setdefault(content, [])
            seen.append([serial, home, True])
            if first is not None:
                answers[home].append((serial, first[0], first[1], True, first[2]))
            elif len(seen) > 1:
                first = seen[0]
                answers[home].append((serial, first[0], first[1], False, True))
                needed[first[1]].append(first[0])
        return [self._to(e, "twins", home, {"twins": answers[home], "needed": needed[home]})
                for home in range(self.count)]

    def _on_twins(self, e: _Epoch, bodies: list[dict]) -> list[Message]:
        """Exact copies found (a twin stored or earlier in the epoch); the other new documents probe."""
        exact = set()
        for body in bodies:
            for serial, twin, home, stored, in_cluster in body["twins"]:
                e.twins[serial] = (twin, home, stored)
                if in_cluster:  # an exact copy; a copy of a document whose cluster was dissolved is not
                    exact.add(serial)
            e.needed.update(body["needed"])
        probing = [serial for serial in e.new if serial not in exact]
        rows = np.array([e.new[serial] for serial in probing], dtype=np.int64)
        bands = self.signing.bands
        slots = band_slots(np.arange(bands, dtype=np.uint64)[None, :], e.batch.keys[rows]).ravel()
        serials = np.repeat(np.array(probing, dtype=np.int64), bands)
        cached = self.closed.cached(slots)
        e.closed_probes = [(slot, asked, self.closed.holders(slot))
                           for slot, asked in _by_slot(slots[cached], serials[cached])]
        slots, serials = slots[~cached], serials[~cached]
        e.probes = (slots, serials)
        parts = _split_by(owners_of_slots(slots, self.count), self.count, serials, slots)
        return [self._to(e, "probes", w, {**_runs(e, owned), "slots": _slots(owned_slots)})
                for w, (owned, owned_slots) in enumerate(parts)]

    def _on_probes(self, e: _Epoch, bodies: list[dict]) -> list[Message]:
        """As a band key's owner: its places to its first probers (``candidates.file_prober``'s rule), and each
        prober the holders of the key's places before it, committed or of the epoch."""
        slots, serials, homes = _slotted(e, bodies)
        starts = np.flatnonzero(np.concatenate(([True], slots[1:] != slots[:-1]))) if len(slots) else _NONE
        run = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, len(slots))))
        rank = np.arange(len(slots)) - starts[run]  # earlier probers of the key in the epoch
        held_start, held_count, held = self.state.places.holders(slots[starts])
        room = np.maximum(self.settings.max_candidates - held_count, 0)[run]
        placed = rank < room
        e.placed = (slots[placed], holder(serials[placed], homes[placed]))
        cap = self.settings.max_candidates
        held_count = np.minimum(held_count, cap)  # a key's holders are its first entries (the rest: ``_on_kept``)
        closed = (held_count >= cap)[run]  # answered once per home, then cached there
        committed = np.where(closed, 0, held_count[run])
        beyond = ~placed & ~closed  # probers past the cap of a key still open when the epoch began
        earlier = np.minimum(rank, room)
        probers = np.concatenate([np.repeat(np.arange(len(slots)), committed),
                                  np.repeat(np.arange(len(slots)), earlier)])
        holders = np.concatenate([held[ranges(held_start[run], committed)],
                                  holder(*(values[ranges(starts[run], earlier)] for values in (serials, homes)))])
        asked = _split_by(homes[probers], self.count, serials[probers], holders)
        past = np.flatnonzero(beyond)
        passed = _split_by(homes[past], self.count, serials[past], slots[past])
        shut = np.flatnonzero(closed)
        closed_runs = _split_by(homes[shut], self.count, run[shut])
        return [self._to(e, "places", home, {"probers": _offsets(e, asked[home][0]), "holders": _ints(asked[home][1]),
                                             "closed": self._closed_for(closed_runs[home][0], slots, starts,
                                                                        held_start, held_count, held),
                                             "beyond": _offsets(e, passed[home][0]),
                                             "beyond_slots": _slots(passed[home][1])})
                for home in range(self.count)]

    @staticmethod
    def _closed_for(runs: np.ndarray, slots, starts, held_start, held_count, held) -> list:
        """The closed keys of ``runs`` (a home's probes of them), each with its holders: (slot, holders)."""
        return [(int(slots[starts[r]]), _ints(held[held_start[r]:held_start[r] + held_count[r]]))
                for r in np.unique(runs).tolist()]

    def _on_places(self, e: _Epoch, bodies: list[dict]) -> list[Message]:
        """Sum the bands each candidate shares; ask each candidate's home to verify those sharing enough."""
        probers = [_from_offsets(e, b["probers"]) for b in bodies]
        holders = [_from_ints(b["holders"]) for b in bodies]
        closed = {slot: _from_ints(packed) for body in bodies for slot, packed in body["closed"]}
        if closed:
            self.state.closed_changed(*self.closed.add(closed))
            slots, serials = e.probes
            probed = np.isin(slots, np.fromiter(closed, dtype=np.uint64, count=len(closed)))
            e.closed_probes += [(slot, asked, closed[slot]) for slot, asked in _by_slot(slots[probed], serials[probed])]
        e.beyond = [(_from_slots(body["beyond_slots"]), _from_offsets(e, body["beyond"])) for body in bodies]
        e.beyond += [(np.full(len(asked), slot, dtype=np.uint64), asked) for slot, asked, _ in e.closed_probes]
        for _, asked, closed in e.closed_probes:
            probers.append(np.repeat(asked, len(closed)))
            holders.append(np.tile(closed, len(asked)))
        probers, holders = np.concatenate(probers), np.concatenate(holders)
        asks: list[list] = [[] for _ in range(self.count)]  # home -> (serial, its candidate serials there)
        if len(probers):
            pairs, first, shared = np.unique(((probers - e.first) << 40) | holder_serials(holders),
                                             return_index=True, return_counts=True)
            strong = shared >= self.signing.min_shared
            probers, candidates = (pairs[strong] >> 40) + e.first, pairs[strong] & ((1 << 40) - 1)
            homes, shared = holder_homes(holders[first[strong]]), shared[strong]
            bounds = np.flatnonzero(np.concatenate(([True], probers[1:] != probers[:-1], [True]))).tolist() \
                if len(probers) else []
            for begin, end in zip(bounds[:-1], bounds[1:]):
                e.candidates[int(probers[begin])] = (candidates[begin:end], shared[begin:end])
            asks = [_grouped(*asked) for asked in _split_by(homes, self.count, probers, candidates)]
        twins: list[list] = [[] for _ in range(self.count)]
        for serial, (twin, home, stored) in sorted(e.twins.items()):
            if stored:
                twins[home].append((serial, twin))
        shingles_of = _packed_shingles(e.batch.shingles)
        return [self._to(e, "verify", home, {"asks": [(serial, shingles_of(e.new[serial]), candidates)
                                                      for serial, candidates in asks[home]],
                                             "twins": twins[home]})
                for home in range(self.count)]

    def _on_verify(self, e: _Epoch, bodies: list[dict]) -> list[Message]:
        """As the candidates' home: the Jaccard of each, at or above the threshold; stored twins' records."""
        threshold = self.settings.threshold
        pairs = [(home, serial, candidate) for home, body in enumerate(bodies)
                 for serial, packed, candidates in body["asks"] for candidate in candidates]
        similarities = self._similarities(e, bodies)
        matched = [candidate for (_, _, candidate), similarity in zip(pairs, similarities)
                   if candidate < e.first and similarity is not None and similarity >= threshold]
        named = self.state.record_ids(matched)
        out = [([], [], {}) for _ in bodies]  # each asker's matches, unkept candidates, names
        for (home, serial, candidate), similarity in zip(pairs, similarities):
            matches, unkept, names = out[home]
            if similarity is None:  # a duplicate's place: it proposes nothing
                unkept.append(candidate)
            elif similarity >= threshold:
                matches.append((serial, candidate, similarity))
                if candidate < e.first:
                    names[candidate] = named[candidate]
        return [self._to(e, "verified", home, {"matches": matches, "unkept": unkept, "names": names,
                                               "twins": [(serial, twin_of(self.state.record(twin)))
                                                         for serial, twin in body["twins"]]})
                for home, ((matches, unkept, names), body) in enumerate(zip(out, bodies))]

    def _similarities(self, e: _Epoch, bodies: list[dict]) -> list[Optional[float]]:
        """The Jaccard of every pair asked (each ask's shingles with each of its candidates, in the messages'
        order): against a stored candidate's shingles (all of them read and compared at once by the state),
        or a candidate's of this epoch (marked needed: its decision is one the asker waits for); None for a
        duplicate's place."""
        owns, serials, found, stored = [], [], [], []
        for body in bodies:
            for _, packed, candidates in body["asks"]:
                shingles = _shingles(packed)
                for candidate in candidates:
                    if candidate >= e.first:
                        e.needed.add(candidate)
                        found.append(jaccard(shingles, e.batch.shingles.of(e.new[candidate])))
                        continue
                    stored.append(len(found))
                    found.append(None)
                    owns.append(shingles)
                    serials.append(candidate)
        for at, similarity in zip(stored, self.state.similarities(owns, serials)):
            found[at] = similarity
        return found

    def _on_verified(self, e: _Epoch, bodies: list[dict]) -> list[Message]:
        """Gather each document's evidence; send every vshard what decides those linked within the epoch."""
        for body in bodies:
            for serial, candidate, similarity in body["matches"]:
                e.matches.setdefault(serial, []).append((candidate, similarity))
            e.unkept.update(body["unkept"])
            e.names.update(body["names"])
            e.twin_records.update((serial, twin) for serial, twin in body["twins"])
        e.waits = _waiting(e)  # once: the candidates and twins are all in
        linked = [self._linked_row(e, serial) for serial in e.new if serial in e.needed or serial in e.waits]
        self.linked_rows += len(linked)
        body = msgpack.packb({"rows": linked}, use_bin_type=True)  # the same for every vshard: packed once
        return [Message(e.number, "linked", self.number, w, body) for w in range(self.count)]

    def _linked_row(self, e: _Epoch, serial: int) -> list:
        batch, row = e.batch, e.new[serial]
        doc = e.documents[row]
        candidates, shared = e.candidates.get(serial, (_NONE, _NONE))
        names = {c: e.names[c] for c in candidates.tolist() if c in e.names}
        return [serial, doc.id, batch.id_keys[row], batch.contents[row], int(batch.sites[row]), _ints(candidates),
                _ints(shared), e.matches.get(serial, []), [c for c in candidates.tolist() if c in e.unkept], names,
                e.twin_records.get(serial), e.waits.get(serial, [])]

    def _on_linked(self, e: _Epoch, bodies: list[dict]) -> list[Message]:
        """Decide this vshard's records of the epoch and the linked documents of others they wait for, in
        order; commit the own ones."""
        linked = {row[0]: row for body in bodies for row in body["rows"]}
        decided = _SubBatch(e, [linked[serial] for serial in sorted(self._ancestors(e, linked))
                                if serial not in e.new])
        together = decide_together(decided.batch(), [decided.evidence], self.settings, e.first, e.now,
                                   mine=decided.mine, gathered=decided.gathered())
        self.decided[e.number] = [together.decisions[i] for i in decided.own_items]
        self._commit(e, together, decided.own_rows)
        return self._kept_beyond(e)

    def _kept_beyond(self, e: _Epoch) -> list[Message]:
        """Tell each key's owner which of the probers past its cap were kept: a kept document is filed under
        every band key it has, as in one index, where it takes a place freed by ``forget`` before any later
        prober does."""
        slots = np.concatenate([slots for slots, _ in e.beyond]) if e.beyond else np.zeros(0, dtype=np.uint64)
        serials = np.concatenate([serials for _, serials in e.beyond]) if e.beyond else _NONE
        kept = np.array([serial in e.kept for serial in serials.tolist()], dtype=bool)
        slots, serials = slots[kept], serials[kept]
        parts = _split_by(owners_of_slots(slots, self.count), self.count, serials, slots)
        return [self._to(e, "kept", w, {**_runs(e, owned), "slots": _slots(owned_slots)})
                for w, (owned, owned_slots) in enumerate(parts)]

    def _on_kept(self, e: _Epoch, bodies: list[dict]) -> list[Message]:
        """As a band key's owner: file the kept documents past its cap after its places, then the epoch is done."""
        slots, serials, homes = _slotted(e, bodies)
        self.state.places.add(slots, holder(serials, homes))
        self._finished(e)
        return []

    @staticmethod
    def _ancestors(e: _Epoch, linked: dict) -> set[int]:
        """The serials of the epoch's linked documents that this vshard's own ones wait for, directly or
        through others: a document's decision depends only on the documents it names (its candidates and
        the first of its content), so the others are left to the vshards that need them."""
        wanted = {serial for waits in e.waits.values() for serial in waits}
        for serial in sorted(linked, reverse=True):
            if serial in wanted:
                wanted.update(linked[serial][-1])
        return wanted

    def _commit(self, e: _Epoch, together, own_rows: dict[int, int]) -> None:
        """Keep what the epoch decided: own documents (home), places and first contents (owner)."""
        records, ids, kept, members = [], [], {}, []
        for serial, (record, row) in together.records.items():
            own = own_rows.get(row)
            if own is None:
                continue
            records.append(record)
            ids.append(e.batch.id_keys[own])
            if record.kept:
                kept[serial] = own
                e.kept.add(serial)
            elif record.cluster:
                members.append((record.cluster, serial))
        self.state.put_documents(records, ids, e.batch.shingles, kept, members)
        self.state.places.add(*e.placed)
        self.state.add_contents(e.contents)

    # -- a forget order ----------------------------------------------------------------------------------

    def forget(self, epoch: int, ids: list[str]) -> list[Message]:
        """Start a forget order, an epoch of its own: every version of each of ``ids`` (those this vshard is
        home to) removed, as ``housekeeping.forget`` removes them from one index. A kept document's places
        are freed (a duplicate's stay taken), its cluster dissolved (its members, wherever they live, belong
        to none: a copy of one is no longer an exact copy), a content's first document forgotten with it."""
        self._starting(epoch, "forget order")
        with collector_paused():
            e = self._epochs[epoch] = _Epoch(epoch, 0.0, 0, 0, prepare([], self.signing), [], [], {}, {})
            places: list[list] = [[] for _ in range(self.count)]
            contents: list[list] = [[] for _ in range(self.count)]
            dissolved: list[int] = []
            for doc_id in ids:
                ident = id_key(doc_id)
                for serial in self.state.serials_of_id(ident):
                    record = self.state.record(serial)
                    if record.id == doc_id:
                        self._forget_one(record, ident, places, contents, dissolved)
            return [self._to(e, "forgotten", w, {"places": places[w], "contents": contents[w],
                                                 "dissolved": dissolved}) for w in range(self.count)]

    def _forget_one(self, record: DocRecord, ident: bytes, places: list, contents: list, dissolved: list) -> None:
        serial = record.serial
        if record.kept:
            keys = band_keys_of([self.state.pop_shingles(serial)], self.signing)
            slots = band_slots(np.arange(self.signing.bands, dtype=np.uint64)[None, :], keys).ravel()
            for slot, owner in zip(slots.tolist(), owners_of_slots(slots, self.count).tolist()):
                places[owner].append((slot, int(holder(serial, self.number))))
            dissolved.append(serial)
        elif record.cluster:
            self.state.remove_member(record.cluster, serial)
        contents[int(owners_of_contents([record.content], self.count)[0])].append((record.content, serial))
        self.state.delete_record(serial)
        self.state.remove_id(ident, serial)

    def _on_forgotten(self, e: _Epoch, bodies: list[dict]) -> list[Message]:
        """Free the forgotten kept documents' places under owned keys, take every forgotten document out of
        its content's documents; dissolve their clusters' members living here."""
        gone = [place for body in bodies for place in body["places"]]
        freed = self.state.places.remove(np.array([slot for slot, _ in gone], dtype=np.uint64),
                                   np.array([held for _, held in gone], dtype=np.int64)) if gone else _NONE
        for body in bodies:
            for content, serial in body["contents"]:
                self.state.drop_content(content, serial)
        out: list[list] = [[] for _ in range(self.count)]
        for cluster in sorted({cluster for body in bodies for cluster in body["dissolved"]}):
            for member in self.state.pop_members(cluster):
                record = self.state.record(member)
                record.cluster, record.cluster_id = 0, ""
                self.state.put_record(record)
                out[int(owners_of_contents([record.content], self.count)[0])].append((record.content, member))
        return [self._to(e, "released", w, {"freed": _ints(freed), "dissolved": out[w]}) for w in range(self.count)]

    def _on_released(self, e: _Epoch, bodies: list[dict]) -> list[Message]:
        """Closed keys whose places were freed are open again (no home answers them from its cache); a first
        document whose cluster was dissolved makes no exact copies."""
        for body in bodies:
            self.state.closed_changed({}, self.closed.reopened(_from_ints(body["freed"], np.uint64)))
            for content, serial in body["dissolved"]:
                self.state.leave_cluster(content, serial)
        self.decided[e.number] = []
        self._finished(e)
        return []

    def _finished(self, e: _Epoch) -> None:
        del self._epochs[e.number]
        del self._stages_done[e.number]
        self.epochs_done = e.number + 1

    # -- helpers ------------------------------------------------------------------------------------------

    def _stored_replays(self, batch: PreparedBatch, documents: list[Document]) -> dict:
        """Row -> the earlier decision of that very document (same id, same content) this home holds."""
        replays = {}
        for row, (ident, serials) in enumerate(zip(batch.id_keys, self.state.serials_of_ids(batch.id_keys))):
            if not serials:
                continue
            doc_id = documents[row].id
            for serial in serials:
                earlier = self.state.record(serial)
                if earlier.content == batch.contents[row] and earlier.id == doc_id:
                    replays[row] = replay_of(earlier)
                    break
        return replays

    @staticmethod
    def _new_rows(batch: PreparedBatch, documents: list[Document], replays: dict) -> list[int]:
        """The rows of new documents: neither a stored document again nor an earlier row again (same id and
        content; every version of an id has this home, so the earlier row is among these). With no id hash
        twice in the batch (most epochs) that is every row but the replays."""
        if len(set(batch.id_keys)) == len(batch.id_keys):
            return [row for row in range(len(batch.contents)) if row not in replays]
        seen, rows = set(), []
        for row, content in enumerate(batch.contents):
            if row in replays:
                continue
            version = (documents[row].id, content)
            if version not in seen:
                seen.add(version)
                rows.append(row)
        return rows

    def _to(self, e: _Epoch, stage: str, to: int, body: dict) -> Message:
        return Message(e.number, stage, self.number, to, msgpack.packb(body, use_bin_type=True))


class _SubBatch:
    """What a vshard decides of an epoch: its own records and the linked documents of other homes they wait
    for, in the deployment's order, with the evidence gathered for each (``decide_together``'s ``gathered``)."""

    def __init__(self, e: _Epoch, others: list):
        batch = e.batch
        own_count = len(e.item_serials)
        serials = np.concatenate((np.asarray(e.item_serials, dtype=np.int64),
                                  np.fromiter((row[0] for row in others), dtype=np.int64, count=len(others))))
        order = np.argsort(serials, kind="stable")  # own items and linked documents by serial, as one order
        own = order < own_count
        home_rows = np.concatenate((np.asarray(batch.row, dtype=np.int64), np.zeros(len(others), dtype=np.int64)))
        home_rows = home_rows[order]
        with_row = ~own | (home_rows >= 0)
        count = int(np.count_nonzero(with_row))
        item_row = np.full(len(order), -1, dtype=np.int64)
        item_row[with_row] = np.arange(count)
        placed = _placed_rows(batch, others, order, own_count, home_rows, with_row)
        self.items: list[Item] = _picked(batch.items, [Document(row[1], "", _ELSEWHERE) for row in others],
                                         order)
        self.item_row: list[int] = item_row.tolist()
        self.contents: list[bytes] = _picked(batch.contents, [row[3] for row in others], placed)
        self.id_keys: list[bytes] = _picked(batch.id_keys, [row[2] for row in others], placed)
        self.sites = np.concatenate((np.asarray(batch.sites, dtype=np.uint64),
                                     np.array([row[4] for row in others], dtype=np.uint64)))[placed]
        self.serial_of: list[int] = serials[order][with_row].tolist()
        self._found: list[tuple[int, np.ndarray, np.ndarray]] = []  # (row, its candidates, bands shared)
        self.evidence = Evidence()
        self.own_items: list[int] = np.flatnonzero(own).tolist()  # the own items' places here, in the home's order
        own_rows = own & with_row
        self.own_rows: dict[int, int] = dict(zip(item_row[own_rows].tolist(), home_rows[own_rows].tolist()))
        self.mine: list[bool] = own.tolist()
        self._add_evidences(e, others, order[with_row] - own_count, home_rows[with_row])

    def _add_evidences(self, e: _Epoch, others: list, linked_at: np.ndarray, home_rows: np.ndarray) -> None:
        """The evidence of the rows here: a replay's stored decision, or what was gathered for a new document
        (``e``'s for an own one, its linked row's for another home's). Each of ``e``'s kinds is added at once,
        placed by a binary search of its serials among the rows' (ascending): the decision reads the evidence
        as dicts and sets (``decide._State``), so only which row each entry names matters, not its order."""
        evidence = self.evidence
        serials = np.asarray(self.serial_of, dtype=np.int64)
        own = linked_at < 0
        here_of_home_row = dict(zip(home_rows[own].tolist(), np.flatnonzero(own).tolist()))
        evidence.replays.update((here_of_home_row[row], replay) for row, replay in e.replays.items())
        self._found += [(here, candidates, shared) for here, (candidates, shared)
                        in zip(_places_of(serials, e.candidates), e.candidates.values())]
        for here, matched in zip(_places_of(serials, e.matches), e.matches.values()):
            evidence.matches += [(here, serial, similarity) for serial, similarity in matched]
        evidence.names.update(e.names)  # the ids of the candidates matched: every one a match of an own row
        evidence.unkept += e.unkept  # the candidates of own rows found to be duplicates' places
        evidence.twins.update(zip(_places_of(serials, e.twin_records), e.twin_records.values()))
        linked = np.flatnonzero(~own)
        for here, at in zip(linked.tolist(), linked_at[linked].tolist()):
            candidates, shared, matches, unkept, names, twin = others[at][5:11]
            if candidates:
                self._found.append((here, _from_ints(candidates), _from_ints(shared)))
            for serial, similarity in matches:
                evidence.matches.append((here, serial, similarity))
                if serial in names:
                    evidence.names[serial] = names[serial]
            evidence.unkept += unkept
            if twin is not None:
                evidence.twins[here] = twin

    def batch(self) -> PreparedBatch:
        n = len(self.contents)
        shingles = ShingleBatch(np.zeros(0, dtype=np.uint32), np.zeros(n + 1, dtype=np.int64))
        return PreparedBatch(self.items, self.item_row, self.contents, self.id_keys, shingles,
                             np.zeros((n, 0), dtype=np.uint64), self.sites, {})

    def gathered(self) -> Gathered:
        """Each row's candidates (``_found``) laid end to end in the rows' order, with their bounds."""
        found = sorted(self._found, key=lambda entry: entry[0])
        counts = np.zeros(len(self.serial_of) + 1, dtype=np.int64)
        counts[1 + np.fromiter((here for here, _, _ in found), dtype=np.int64, count=len(found))] = \
            [len(serials) for _, serials, _ in found]
        bounds = np.cumsum(counts).tolist()
        if found:
            serials = np.concatenate([serials for _, serials, _ in found]).astype(np.int64)
            shared = np.concatenate([shared for _, _, shared in found]).astype(np.int64)
        else:
            serials = shared = _NONE
        return Gathered(Hits(serials, shared, bounds), self.serial_of)


def _packed_shingles(shingles: ShingleBatch) -> Callable[[int], list]:
    """A row's shingles as a ``verify`` message carries them, [their dtype, their bytes], cut from one view of
    every row's: a row's numpy slice made into bytes cost three times as much, on a third of the documents."""
    hashes = np.ascontiguousarray(shingles.hashes)
    view, dtype = memoryview(hashes).cast("B"), hashes.dtype.str
    bounds = (shingles.offsets * hashes.itemsize).tolist()
    return lambda row: [dtype, bytes(view[bounds[row]:bounds[row + 1]])]


def _waiting(e: _Epoch) -> dict[int, list[int]]:
    """``waits_for`` of each new document that waits for another of the epoch (those with a candidate of the
    epoch or a twin of it; the rest, most of them, wait for none), in serial order."""
    waiting = {serial for serial, (found, _) in e.candidates.items() if int(found[-1]) >= e.first}
    waiting.update(serial for serial, (_, _, stored) in e.twins.items() if not stored)
    return {serial: e.waits_for(serial) for serial in sorted(waiting)}


def _places_of(serials: np.ndarray, keyed: dict) -> list[int]:
    """Where each key of ``keyed`` (serials, all among the ascending ``serials``) stands in ``serials``."""
    return np.searchsorted(serials, np.fromiter(keyed, dtype=np.int64, count=len(keyed))).tolist()


def _placed_rows(batch: PreparedBatch, others: list, order: np.ndarray, own_count: int, home_rows: np.ndarray,
                 with_row: np.ndarray) -> np.ndarray:
    """Where each row of a ``_SubBatch`` comes from, in one index over the home's rows followed by the linked
    documents (``_picked``'s): an own item's row of the home's batch, or a linked document's place past them."""
    at = np.where(order < own_count, home_rows, order - own_count + len(batch.contents))
    return at[with_row]


def _picked(first: list, then: list, at: np.ndarray) -> list:
    """The entries of ``first`` followed by ``then`` at the places ``at``."""
    pool = first + then if then else first
    return [pool[i] for i in at.tolist()]


def _split_by(labels: np.ndarray, count: int, *columns: np.ndarray) -> list[tuple[np.ndarray, ...]]:
    """``columns`` cut by ``labels`` (0 to ``count`` - 1, one an entry): for each label, each column's entries
    where it stands, in their order. One stable sort, where a mask a label went over every entry ``count``
    times (a stage's messages to every vshard). The labels are sorted in the narrowest type that holds them,
    which numpy sorts by radix (8 times faster than int64 at 8 vshards)."""
    order = np.argsort(_narrowest(labels, count), kind="stable")
    bounds = np.concatenate(([0], np.cumsum(np.bincount(labels, minlength=count)))).tolist() if len(labels) \
        else [0] * (count + 1)
    ordered = [column[order] for column in columns]
    return [tuple(column[bounds[w]:bounds[w + 1]] for column in ordered) for w in range(count)]


def _narrowest(labels: np.ndarray, count: int) -> np.ndarray:
    """``labels`` (0 to ``count`` - 1) in 8 or 16 bits if they fit."""
    if count <= 1 << 8:
        return labels.astype(np.uint8)
    return labels.astype(np.uint16) if count <= 1 << 16 else labels


def _grouped(serials: np.ndarray, values: np.ndarray) -> list[tuple[int, list]]:
    """(serial, its values) of each run of equal ``serials`` (sorted), in order."""
    if not len(serials):
        return []
    bounds = np.flatnonzero(np.concatenate(([True], serials[1:] != serials[:-1], [True]))).tolist()
    serials, values = serials.tolist(), values.tolist()
    return [(serials[begin], values[begin:end]) for begin, end in zip(bounds[:-1], bounds[1:])]


def _by_slot(slots: np.ndarray, serials: np.ndarray):
    """(slot, its serials) for each slot of ``slots``, in slot order."""
    order = np.argsort(slots, kind="stable")
    slots, serials = slots[order], serials[order]
    starts = np.flatnonzero(np.concatenate(([True], slots[1:] != slots[:-1]))) if len(slots) else _NONE
    ends = np.append(starts[1:], len(slots))
    return [(int(slots[b]), serials[b:e]) for b, e in zip(starts.tolist(), ends.tolist())]


def _slotted(e: _Epoch, bodies: list[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The (slot, serial, home) of every vshard's message of band slots (``_runs``, ``slots``), sorted by slot,
    then serial."""
    each = [_from_runs(b) for b in bodies]
    offsets = np.concatenate(each).astype(np.uint64)
    homes = np.concatenate([np.full(len(at), v, dtype=np.int64) for v, at in enumerate(each)])
    slots = np.concatenate([_from_slots(b["slots"]) for b in bodies])
    order = np.argsort(_slot_then_offset(slots, offsets))
    return slots[order], offsets[order].astype(np.int64) + e.first, homes[order]


def _slot_then_offset(slots: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """One sort key a (slot, offset in the epoch) pair, in the pairs' order (``np.lexsort`` of the two took 9 times
    as long as sorting one key): a slot has 40 bits (``_slots``), so the offset has 24, or the pairs are ranked
    (an epoch of 2^24 records or more)."""
    if len(offsets) and int(offsets.max()) >= 1 << _OFFSET_BITS:
        ranks = np.empty(len(offsets), dtype=np.uint64)
        ranks[np.lexsort((offsets, slots))] = np.arange(len(offsets), dtype=np.uint64)
        return ranks
    return (slots.astype(np.uint64) << np.uint64(_OFFSET_BITS)) | offsets


def _offsets(e: _Epoch, serials: np.ndarray) -> bytes:
    """Serials of the epoch as 4-byte offsets from its first."""
    return np.ascontiguousarray(serials - e.first, dtype="<u4").tobytes()


def _runs(e: _Epoch, serials: np.ndarray) -> dict:
    """Serials of the epoch, one for each band slot sent beside them, as runs: each run's 4-byte offset from the
    epoch's first (``at``) and its length (``runs``, 2 bytes each, or 4 if a run is longer). A document's slots
    to one owner go together, so its serial goes once instead of once a slot: a probing document sent its
    serial 32 times, 128 of the probes' 272 bytes a document; at 8 vshards it now goes some 8 times with a
    length (47 bytes). A change of this coding is a change of ``messages.KEYS_FORMAT``."""
    offsets = np.ascontiguousarray(serials - e.first, dtype="<u4")
    starts = np.flatnonzero(np.concatenate(([True], offsets[1:] != offsets[:-1]))) if len(offsets) else _NONE
    lengths = np.diff(np.append(starts, len(offsets)))
    width = "<u2" if not len(lengths) or int(lengths.max()) <= 0xFFFF else "<u4"
    return {"at": offsets[starts].tobytes(), "runs": lengths.astype(width).tobytes()}


def _from_runs(body: dict) -> np.ndarray:
    """The offsets of ``_runs``, one a slot (the serials less the epoch's first)."""
    at = np.frombuffer(body["at"], dtype="<u4")
    width = "<u2" if len(body["runs"]) == 2 * len(at) else "<u4"
    return np.repeat(at, np.frombuffer(body["runs"], dtype=width).astype(np.int64))


def _from_offsets(e: _Epoch, data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<u4").astype(np.int64) + e.first


def _slots(slots: np.ndarray) -> bytes:
    """Band slots (band << 32 | key) as 5 bytes each: the keys' 4, then the bands' 1."""
    slots = np.asarray(slots, dtype=np.uint64)
    return (slots & np.uint64(0xFFFFFFFF)).astype("<u4").tobytes() + (slots >> np.uint64(32)).astype("u1").tobytes()


def _from_slots(data: bytes) -> np.ndarray:
    n = len(data) // 5
    keys = np.frombuffer(data[:4 * n], dtype="<u4").astype(np.uint64)
    return (np.frombuffer(data[4 * n:], dtype="u1").astype(np.uint64) << np.uint64(32)) | keys


def _ints(values: np.ndarray) -> bytes:
    return np.ascontiguousarray(values, dtype="<i8").tobytes()


def _from_ints(data: bytes, dtype=np.int64) -> np.ndarray:
    return np.frombuffer(data, dtype="<i8").astype(dtype)


def _shingles(packed: list) -> np.ndarray:
    dtype, data = packed
    return np.frombuffer(data, dtype=dtype)
