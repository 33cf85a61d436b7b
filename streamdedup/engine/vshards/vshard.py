"""One virtual shard: the home of its documents, the owner of its keys, and what it does at each stage of an epoch.

An epoch is one slice of every vshard's input (a vshard's slice may be
empty). Its order is (vshard, place in the slice), and its new documents (all
but replays) are numbered in that order from the deployment's next serial.
Seven kinds of message go between vshards in an epoch; a vshard runs a stage
once the message of every vshard for it is in, so the order messages arrive
in changes nothing, and a second copy of a message is dropped:

============  =====================  ==================================================================
stage         from -> to             carries, and what the receiver does with it
============  =====================  ==================================================================
``contents``  home -> every vshard   the slice's count of new documents (every vshard numbers the
                                     epoch from the counts) and the contents the receiver owns: it
                                     answers the first document of each
``twins``     content owner -> home  each content's first document, stored or earlier in the epoch:
                                     the home's exact copies are found; the other new documents probe
``probes``    home -> band owner     the band slots of the probing documents: the owner gives each
                                     key's places to its first ``max_candidates`` probers
``places``    band owner -> home     the holders of a key's places before each prober: the home sums
                                     the bands each candidate shares
``verify``    home(d) -> home(c)     d's shingles and its candidates living at c's home; the records of
                                     stored twins: Jaccard there, where the candidate's shingles are
``verified``  home(c) -> home(d)     the matches at or above the threshold, the candidates that are
                                     duplicates' places (no shingles), their names, the twins' records
``linked``    home -> every vshard   what decides each document linked to another of the epoch (a
                                     candidate or twin of the epoch, or one itself): every vshard
                                     decides those alike, with its own documents, and commits
============  =====================  ==================================================================

Decisions are ``decide.decide_together``'s on the evidence gathered so
(``evidence.Gathered``), the single worker's with ``lsh.cap = "probes"``: a
key's places go to its first probers whatever they are then decided, so a
key's owner answers before the decisions of the epoch are known, and only
the documents linked within the epoch wait for each other.

A vshard keeps its state in memory here: the stores it will keep in LMDB
(records, shingles and ids at home; places and first contents for the keys
it owns), with the same content.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import msgpack
import numpy as np

from ...config import Config
from ...core.lsh import band_slots
from ...core.prepare import PreparedBatch, prepare
from ...core.records import Decision, Document, Item, Source
from ...core.shingle import ShingleBatch
from ...core.verify import jaccard
from ...errors import ConfigError
from ...store.candidates import Hits
from ...store.index import DocRecord
from ..decide import decide_together
from ..evidence import Evidence, Gathered
from ..settings import DedupSettings
from .placement import owners_of_contents, owners_of_slots

__all__ = ["Message", "VShard", "STAGES", "check_supported"]

STAGES = ("contents", "twins", "probes", "places", "verify", "verified", "linked")
_ELSEWHERE = Source("vshard", -1, -1)  # another home's document decided here: never written, never sent out


@dataclass(frozen=True)
class Message:
    """One message between vshards: deterministic, so a copy delivered twice is the same message."""

    epoch: int
    stage: str
    sender: int
    to: int
    body: bytes  # msgpack


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
    """What a vshard knows of one epoch in flight."""

    number: int
    now: float
    items: list[Item]
    batch: PreparedBatch
    replays: dict  # row -> the stored decision it replays
    new_rows: np.ndarray  # the rows that are new documents (not replays), in order: their ranks
    first: int = 0  # the epoch's first serial
    bases: list[int] = field(default_factory=list)  # each vshard's first serial in the epoch
    total: int = 0
    twins: dict = field(default_factory=dict)  # rank -> (serial, home, stored)
    needed: set = field(default_factory=set)  # ranks another document of the epoch depends on
    first_contents: dict = field(default_factory=dict)  # content -> (serial, home): owned, first seen here
    placed: list = field(default_factory=list)  # (slots, serials, homes) arrays: places filed here (owned keys)
    candidates: dict = field(default_factory=dict)  # rank -> (serials, shared), strong ones, ascending
    matches: dict = field(default_factory=dict)  # rank -> [(serial, Jaccard)]
    unkept: set = field(default_factory=set)
    names: dict = field(default_factory=dict)
    twin_records: dict = field(default_factory=dict)  # rank -> [serial, cluster, cluster id, id]

    def __post_init__(self):
        self.ranks = {row: rank for rank, row in enumerate(self.new_rows.tolist())}  # row -> rank
        self.item_of_row = _item_of_rows(self.batch)


class VShard:
    """Virtual shard ``number`` of ``count``: ``slice`` starts an epoch, ``receive`` takes every message."""

    def __init__(self, number: int, count: int, settings: DedupSettings):
        if settings.signing.cap != "probes":
            raise ConfigError('a deployment with band tables split by key needs lsh.cap = "probes"')
        self.number, self.count, self.settings, self.signing = number, count, settings, settings.signing
        self.records: dict[int, DocRecord] = {}  # home: its documents
        self.shingles: dict[int, np.ndarray] = {}  # home: its kept documents' content shingles
        self.ids: dict[bytes, list[int]] = {}  # home: id hash -> serials
        self.places: dict[int, list[tuple[int, int]]] = {}  # owner: band slot -> (serial, home) of its places
        self.firsts: dict[bytes, tuple[int, int]] = {}  # owner: content -> (serial, home) of its first document
        self.next_serial = 1
        self.decided: dict[int, list[Decision]] = {}  # epoch -> decisions of the slice's items, in order
        self.epochs_done = 0  # epochs are numbered from 0 and decided one after the other
        self._inbox: dict[tuple[int, str], dict[int, bytes]] = {}
        self._stages_done: dict[int, set[str]] = {}
        self._epochs: dict[int, _Epoch] = {}

    # -- the two ways in --------------------------------------------------------------------------------

    def slice(self, epoch: int, items: list[Item], now: float) -> list[Message]:
        """Start ``epoch`` with this vshard's slice of its input (items whose ids it is home to)."""
        batch = prepare(items, self.signing)
        replays = self._stored_replays(batch)
        new_rows = np.array(self._new_rows(batch, replays), dtype=np.int64)
        self._epochs[epoch] = e = _Epoch(epoch, now, batch.items, batch, replays, new_rows)
        contents = [batch.contents[row] for row in new_rows.tolist()]
        owners = owners_of_contents(contents, self.count) if contents else np.zeros(0, dtype=np.int64)
        return [self._to(e, "contents", w, {"count": len(new_rows), "ranks": _ints(np.flatnonzero(owners == w)),
                                            "contents": [contents[i] for i in np.flatnonzero(owners == w).tolist()]})
                for w in range(self.count)]

    def receive(self, message: Message) -> list[Message]:
        """Take one message; once every vshard's is in for its stage, run the stage: the messages it sends."""
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
        """Number the epoch; as a content owner, answer each new document with its content's first."""
        counts = [body["count"] for body in bodies]
        e.first, e.total = self.next_serial, sum(counts)
        e.bases = (self.next_serial + np.concatenate(([0], np.cumsum(counts)[:-1]))).astype(np.int64).tolist()
        answers: list[list] = [[] for _ in range(self.count)]
        needed: list[set] = [set() for _ in range(self.count)]
        for home, body in enumerate(bodies):  # in the epoch's order
            for rank, content in zip(_from_ints(body["ranks"]).tolist(), body["contents"]):
                stored = self.firsts.get(content)
                if stored is not None:
                    answers[home].append((rank, stored[0], stored[1], True))
                    continue
                first = e.first_contents.get(content)
                if first is None:
                    e.first_contents[content] = (e.bases[home] + rank, home)
                else:
                    answers[home].append((rank, first[0], first[1], False))
                    needed[first[1]].add(first[0] - e.bases[first[1]])
        return [self._to(e, "twins", home, {"twins": answers[home], "needed": sorted(needed[home])})
                for home in range(self.count)]

    def _on_twins(self, e: _Epoch, bodies: list[dict]) -> list[Message]:
        """Exact copies found (a twin stored or earlier in the epoch); the others probe their band keys."""
        for body in bodies:
            for rank, serial, home, stored in body["twins"]:
                e.twins[rank] = (serial, home, stored)
            e.needed.update(body["needed"])
        probing = np.array([rank for rank in range(len(e.new_rows)) if rank not in e.twins], dtype=np.int64)
        bands = self.signing.bands
        slots = band_slots(np.arange(bands, dtype=np.uint64)[None, :], e.batch.keys[e.new_rows[probing]]).ravel()
        ranks = np.repeat(probing, bands)
        owners = owners_of_slots(slots, self.count)
        return [self._to(e, "probes", w, {"ranks": _ints(ranks[owners == w]), "slots": _ints(slots[owners == w])})
                for w in range(self.count)]

    def _on_probes(self, e: _Epoch, bodies: list[dict]) -> list[Message]:
        """As a band key's owner: its places to its first probers, and each prober the holders before it."""
        serials = np.concatenate([e.bases[v] + _from_ints(b["ranks"]) for v, b in enumerate(bodies)])
        homes = np.concatenate([np.full(len(b["ranks"]) // 8, v, dtype=np.int64) for v, b in enumerate(bodies)])
        slots = np.concatenate([_from_ints(b["slots"], np.uint64) for b in bodies])
        answers: list[list] = [[] for _ in range(self.count)]
        if len(slots):
            order = np.lexsort((serials, slots))
            slots, serials, homes = slots[order], serials[order], homes[order]
            starts = np.flatnonzero(np.concatenate(([True], slots[1:] != slots[:-1])))
            ends = np.append(starts[1:], len(slots))
            held = [slot in self.places for slot in slots[starts].tolist()]
            alone = (ends - starts == 1) & ~np.array(held, dtype=bool)  # most keys: one prober, no place taken
            e.placed.append((slots[starts[alone]], serials[starts[alone]], homes[starts[alone]]))
            for begin, end in zip(starts[~alone].tolist(), ends[~alone].tolist()):
                self._file_probers(e, int(slots[begin]), serials[begin:end].tolist(), homes[begin:end].tolist(),
                                   answers)
        return [self._to(e, "places", home, {"holders": _ints(np.array(answers[home], dtype=np.int64).ravel())})
                for home in range(self.count)]

    def _file_probers(self, e: _Epoch, slot: int, serials: list[int], homes: list[int], answers: list[list]) -> None:
        """One key's probers of the epoch, in order: each told the holders of places before it, and given one
        while the key has room (``candidates.file_prober``'s rule)."""
        holders = list(self.places.get(slot, ()))
        room = self.settings.max_candidates - len(holders)
        placed = []
        for serial, home in zip(serials, homes):
            rank = serial - e.bases[home]
            for holder, holder_home in holders:
                answers[home].append((rank, holder, holder_home))
            if room > 0:
                room -= 1
                holders.append((serial, home))
                placed.append((serial, home))
        if placed:
            e.placed.append((np.full(len(placed), slot, dtype=np.uint64), *np.array(placed, dtype=np.int64).T))

    def _on_places(self, e: _Epoch, bodies: list[dict]) -> list[Message]:
        """Sum the bands each candidate shares; ask each candidate's home to verify those sharing enough."""
        held = np.concatenate([_from_ints(b["holders"]) for b in bodies]).reshape(-1, 3)
        asks: list[dict] = [{} for _ in range(self.count)]  # home -> rank -> serials
        if len(held):
            pairs, first, shared = np.unique((held[:, 0] << 40) | held[:, 1], return_index=True, return_counts=True)
            strong = shared >= self.signing.min_shared
            ranks, serials, homes = pairs[strong] >> 40, pairs[strong] & ((1 << 40) - 1), held[first[strong], 2]
            shared = shared[strong]
            bounds = np.flatnonzero(np.concatenate(([True], ranks[1:] != ranks[:-1], [True]))) .tolist() if len(ranks) else []
            for begin, end in zip(bounds[:-1], bounds[1:]):
                rank = int(ranks[begin])
                e.candidates[rank] = (serials[begin:end], shared[begin:end])
                for serial, home in zip(serials[begin:end].tolist(), homes[begin:end].tolist()):
                    asks[home].setdefault(rank, []).append(serial)
        twins: list[list] = [[] for _ in range(self.count)]
        for rank, (serial, home, stored) in sorted(e.twins.items()):
            if stored:
                twins[home].append((rank, serial))
        return [self._to(e, "verify", home, {"asks": [(rank, self._shingles_of(e, rank), serials)
                                                      for rank, serials in sorted(asks[home].items())],
                                             "twins": twins[home]})
                for home in range(self.count)]

    def _on_verify(self, e: _Epoch, bodies: list[dict]) -> list[Message]:
        """As the candidates' home: the Jaccard of each, at or above the threshold; stored twins' records."""
        own_base = e.bases[self.number]
        replies = []
        for home, body in enumerate(bodies):
            matches, unkept, names = [], [], {}
            for rank, packed, serials in body["asks"]:
                shingles = _shingles(packed)
                for serial in serials:
                    stored = self._candidate_shingles(e, serial, own_base)
                    if stored is None:  # a duplicate's place: it proposes nothing
                        unkept.append(serial)
                        continue
                    similarity = jaccard(shingles, stored)
                    if similarity >= self.settings.threshold:
                        matches.append((rank, serial, similarity))
                        if serial < e.first:
                            names[serial] = self.records[serial].id
            twins = [(rank, _twin_of(self.records[serial])) for rank, serial in body["twins"]]
            replies.append(self._to(e, "verified", home, {"matches": matches, "unkept": unkept, "names": names,
                                                           "twins": twins}))
        return replies

    def _candidate_shingles(self, e: _Epoch, serial: int, own_base: int) -> Optional[np.ndarray]:
        """A candidate's shingles: stored (a kept document's), or of this epoch (marked needed: its decision is
        one the asker waits for); None for a duplicate's place."""
        if serial >= e.first:
            rank = serial - own_base
            e.needed.add(rank)
            return e.batch.shingles.of(int(e.new_rows[rank]))
        return self.shingles.get(serial)

    def _on_verified(self, e: _Epoch, bodies: list[dict]) -> list[Message]:
        """Gather each document's evidence; send every vshard what decides those linked within the epoch."""
        for body in bodies:
            for rank, serial, similarity in body["matches"]:
                e.matches.setdefault(rank, []).append((serial, similarity))
            e.unkept.update(body["unkept"])
            e.names.update(body["names"])
            e.twin_records.update((rank, twin) for rank, twin in body["twins"])
        linked = [self._linked_row(e, rank) for rank in range(len(e.new_rows)) if self._is_linked(e, rank)]
        return [self._to(e, "linked", w, {"rows": linked}) for w in range(self.count)]

    def _is_linked(self, e: _Epoch, rank: int) -> bool:
        """Whether a new document's decision waits for another of the epoch, or another waits for it."""
        if rank in e.needed:
            return True
        twin = e.twins.get(rank)
        if twin is not None and not twin[2]:
            return True
        found = e.candidates.get(rank)
        return found is not None and int(found[0][-1]) >= e.first

    def _linked_row(self, e: _Epoch, rank: int) -> list:
        row = int(e.new_rows[rank])
        doc = e.batch.items[e.item_of_row[row]]
        serials, shared = e.candidates.get(rank, (np.zeros(0, np.int64), np.zeros(0, np.int64)))
        return [rank, doc.id, e.batch.id_keys[row], e.batch.contents[row], int(e.batch.sites[row]),
                _ints(serials), _ints(shared), e.matches.get(rank, []),
                [s for s in serials.tolist() if s in e.unkept], {s: e.names[s] for s in serials.tolist() if s in e.names},
                e.twin_records.get(rank)]

    def _on_linked(self, e: _Epoch, bodies: list[dict]) -> list[Message]:
        """Decide this vshard's slice and every linked document of the epoch, in order; commit the own ones."""
        decided = _SubBatch(self, e, bodies)
        together = decide_together(decided.batch(), [decided.evidence], self.settings, e.first, e.now,
                                   mine=decided.mine, gathered=decided.gathered())
        self.decided[e.number] = [together.decisions[i] for i in decided.own_items]
        self._commit(e, together, decided.own_rows)
        del self._epochs[e.number]
        del self._stages_done[e.number]
        self.epochs_done = e.number + 1
        return []

    def _commit(self, e: _Epoch, together, own_rows: dict[int, int]) -> None:
        """Keep what the epoch decided: own documents (home), places and first contents (owner)."""
        for serial, (record, row) in together.records.items():
            own = own_rows.get(row)
            if own is None:
                continue
            self.records[serial] = record
            self.ids.setdefault(e.batch.id_keys[own], []).append(serial)
            if record.kept:
                self.shingles[serial] = e.batch.shingles.of(own)
        places = self.places
        for slots, serials, homes in e.placed:
            for slot, serial, home in zip(slots.tolist(), serials.tolist(), homes.tolist()):
                held = places.get(slot)
                if held is None:
                    places[slot] = [(serial, home)]
                else:
                    held.append((serial, home))
        self.firsts.update(e.first_contents)
        self.next_serial = e.first + e.total

    # -- helpers ------------------------------------------------------------------------------------------

    def _stored_replays(self, batch: PreparedBatch) -> dict:
        """Row -> the earlier decision of that very document (same id, same content) this home holds."""
        replays = {}
        items = _item_of_rows(batch)
        for row, ident in enumerate(batch.id_keys):
            for serial in sorted(self.ids.get(ident, ())):
                earlier = self.records[serial]
                if earlier.content == batch.contents[row] and earlier.id == batch.items[items[row]].id:
                    replays[row] = [earlier.id, earlier.kept, earlier.cluster_id, earlier.matched_id,
                                    earlier.similarity, earlier.exact, earlier.containment]
                    break
        return replays

    @staticmethod
    def _new_rows(batch: PreparedBatch, replays: dict) -> list[int]:
        """The rows that take a serial: neither a stored document again nor an earlier row of the slice again
        (same id and content; every version of an id has this home, so the earlier row is in this slice)."""
        items = _item_of_rows(batch)
        seen, rows = set(), []
        for row, content in enumerate(batch.contents):
            if row in replays:
                continue
            version = (batch.items[items[row]].id, content)
            if version not in seen:
                seen.add(version)
                rows.append(row)
        return rows

    @staticmethod
    def _shingles_of(e: _Epoch, rank: int) -> list:
        shingles = e.batch.shingles.of(int(e.new_rows[rank]))
        return [shingles.dtype.str, shingles.tobytes()]

    def _to(self, e: _Epoch, stage: str, to: int, body: dict) -> Message:
        return Message(e.number, stage, self.number, to, msgpack.packb(body, use_bin_type=True))


class _SubBatch:
    """What a vshard decides of an epoch: its own slice and every other home's linked documents, in the
    epoch's order, with the evidence gathered for each (``decide_together``'s ``gathered`` form)."""

    def __init__(self, vshard: VShard, e: _Epoch, bodies: list[dict]):
        self.items: list[Item] = []
        self.item_row: list[int] = []
        self.contents: list[bytes] = []
        self.id_keys: list[bytes] = []
        self.sites: list[int] = []
        self.serial_of: list[int] = []
        self.candidates: list[tuple[np.ndarray, np.ndarray]] = []
        self.evidence = Evidence()
        self.own_items: list[int] = []
        self.own_rows: dict[int, int] = {}  # row here -> row of the own slice
        self.mine: list[bool] = []
        for home, body in enumerate(bodies):
            if home == vshard.number:
                self._add_own(e, e.bases[home])
            else:
                for linked in body["rows"]:
                    self._add_linked(e, home, linked)

    def _add_own(self, e: _Epoch, base: int) -> None:
        batch = e.batch
        for item, row in zip(batch.items, batch.row):
            self.own_items.append(len(self.items))
            self.mine.append(True)
            if row < 0:
                self.items.append(item)
                self.item_row.append(-1)
                continue
            rank = e.ranks.get(row, -1)
            here = self._add_row(item, batch.contents[row], batch.id_keys[row], int(batch.sites[row]),
                                 base + rank if rank >= 0 else -1)
            self.own_rows[here] = row
            if row in e.replays:
                self.evidence.replays[here] = e.replays[row]
            if rank < 0:
                continue
            self._add_evidence(here, e.candidates.get(rank), e.matches.get(rank, ()), e.unkept, e.names,
                               e.twin_records.get(rank))

    def _add_linked(self, e: _Epoch, home: int, linked: list) -> None:
        rank, doc_id, ident, content, site, serials, shared, matches, unkept, names, twin = linked
        self.mine.append(False)
        here = self._add_row(Document(doc_id, "", _ELSEWHERE), content, ident, site, e.bases[home] + rank)
        self._add_evidence(here, (_from_ints(serials), _from_ints(shared)), matches, set(unkept), names, twin)

    def _add_row(self, item: Item, content: bytes, ident: bytes, site: int, serial: int) -> int:
        row = len(self.contents)
        self.items.append(item)
        self.item_row.append(row)
        self.contents.append(content)
        self.id_keys.append(ident)
        self.sites.append(site)
        self.serial_of.append(serial)
        self.candidates.append((np.zeros(0, np.int64), np.zeros(0, np.int64)))
        return row

    def _add_evidence(self, row: int, candidates, matches, unkept, names: dict, twin) -> None:
        if candidates is not None:
            self.candidates[row] = candidates
            for serial in candidates[0].tolist():
                if serial in unkept:
                    self.evidence.unkept.append(serial)
        self.evidence.matches.extend((row, serial, similarity) for serial, similarity in matches)
        self.evidence.names.update(names)
        if twin is not None:
            self.evidence.twins[row] = twin

    def batch(self) -> PreparedBatch:
        n = len(self.contents)
        shingles = ShingleBatch(np.zeros(0, dtype=np.uint32), np.zeros(n + 1, dtype=np.int64))
        return PreparedBatch(self.items, self.item_row, self.contents, self.id_keys, shingles,
                             np.zeros((n, 0), dtype=np.uint64), np.array(self.sites, dtype=np.uint64), {})

    def gathered(self) -> Gathered:
        counts = [len(serials) for serials, _ in self.candidates]
        bounds = np.concatenate(([0], np.cumsum(counts))).astype(np.int64).tolist()
        if bounds[-1]:
            serials = np.concatenate([serials for serials, _ in self.candidates])
            shared = np.concatenate([shared for _, shared in self.candidates])
        else:
            serials = shared = np.zeros(0, dtype=np.int64)
        return Gathered(Hits(serials.astype(np.int64), shared.astype(np.int64), bounds), self.serial_of)


def _twin_of(record: DocRecord) -> list:
    return [record.serial, record.cluster, record.cluster_id, record.id]


def _item_of_rows(batch: PreparedBatch) -> list[int]:
    """The item of each document row."""
    return [i for i, row in enumerate(batch.row) if row >= 0]


def _ints(values: np.ndarray) -> bytes:
    return np.ascontiguousarray(values, dtype="<i8").tobytes()


def _from_ints(data: bytes, dtype=np.int64) -> np.ndarray:
    return np.frombuffer(data, dtype="<i8").astype(dtype)


def _shingles(packed: list) -> np.ndarray:
    dtype, data = packed
    return np.frombuffer(data, dtype=dtype)
