/* Compiled kernel of shingle.py and signing.py: the same definitions, one pass per document.
 *
 * shingles(points, starts, lengths, kind_word, k, out_hashes, out_offsets) -> shingles written
 *     Sorted unique shingle hashes of every document of a NormalizedBatch, exactly as
 *     shingle.shingle_batch computes them (poly hash of the span's code points, length mixed in,
 *     fmix64), written into out_hashes (room for sum(lengths) + documents) and out_offsets.
 * minhash(hashes, wide, offsets, a, b, out)
 *     MinHash signatures exactly as signing.sign_batch: out[d, p] = min over the document's
 *     shingles x of a[p] * x + b[p] mod 2**32, where x is the top 32 bits of a 64-bit hash
 *     (wide) or a 32-bit narrowed shingle as it is. A document without shingles gets
 *     0xFFFFFFFF everywhere.
 *
 * ascii_normalize(text, text_lengths, out, out_lengths) -> bytes written
 *     The ASCII fast path of shingle.normalize on the concatenation of a batch's texts: letters
 *     lowercased, digits kept, anything else a space, runs of spaces collapsed, ends trimmed;
 *     documents written one after another into out, separated by a 0 byte.
 *
 * ef_encode(values) -> bytes, ef_encode_many(values, offsets[, rows]) -> list of bytes, ef_decode(data) -> bytes
 *     Elias-Fano coding of sorted unique uint32 values, exactly as eliasfano.py (its module
 *     docstring gives the layout); ef_encode_many codes every document of (values, offsets), or
 *     those numbered by rows (int64); ef_decode returns the values as little-endian uint32 bytes
 *     and raises ValueError on data that is not such a coding.
 *
 * shared_count(a, b) -> int
 *     How many values two sorted unique uint32 arrays share (verify.jaccard's intersection).
 *
 * sorted_member(values, table, out)
 *     out[i] (one byte) = whether uint32 values[i] is in the sorted uint32 table: templates.in_sorted,
 *     numpy's searchsorted-and-compare without its calls' overhead on a page's few hundred values.
 *
 * sorted_union(a, b, out) -> int
 *     The sorted union of two sorted uint32 arrays, each value once, written to the front of out (room for
 *     both); how many, or -1 when one of them is not sorted: templates._merged. Two strictly increasing
 *     arrays are merged by runs: the smaller's values put between the larger's runs, copied whole (a site's
 *     few hundred new shingles into its tens of thousands).
 *
 * sorted_without(values, table, shared, out) -> int
 *     The uint32 values in neither sorted uint32 table, in their order, written to the front of out (room
 *     for every value); how many: templates.content_of's shingles without its two templates.
 *
 * bucket_starts(table, shift, out)
 *     Where each bucket of a sorted uint32 table starts: out[j] (uint32, 2**(32 - shift) + 1 of them) = the
 *     first place whose value >> shift is j or more (the last: len(table)); templates.GrowingSet's main part.
 *
 * growing_member(values, main, starts, shift, recent, out)
 *     out[i] (one byte) = whether uint32 values[i] is in sorted main (found through its bucket_starts) or in
 *     sorted recent: templates.GrowingSet.contains, one bucket's few values walked a value instead of a
 *     search through a site's hundreds of thousands of seen shingles.
 *
 * new_and_again(page, seen main, starts, shift, recent, repeated main, starts, shift, recent, fresh, again)
 *     -> (fresh count, again count)
 *     A new page's values (uint32) against its site's two GrowingSets (each as growing_member reads it): those
 *     not in seen, in order, into fresh, and those in seen but not in repeated into again (both with room for
 *     the page): templates.SiteState.count_repeats in one call.
 *
 * hashed_add(values, stamps, slots, meta)
 * hashed_count(page, slots, meta, takes, stamp, fresh, again) -> (fresh count, again count)
 * hashed_member(values, slots, meta, stamp, out)
 *     A site's seen and repeated shingles as one open-addressed table (templates.RepeatTable): slots, uint32
 *     pairs (key, stamp), a power of two of them, key 0 an empty slot, linear probing from the top bits of
 *     value * 0x9E3779B1; a key's stamp 2**32 - 1 while seen on one page, else when it was first seen again;
 *     meta (uint32) = [values held, whether 0 is held, 0's stamp, values repeated]. hashed_add puts
 *     values[i] with stamps[i] (a value held gets the new stamp) in a table with room for the new ones;
 *     hashed_count is new_and_again on the table, putting the fresh values in (when takes) and stamping the
 *     again ones stamp as it goes; hashed_member: out[i] (one byte) = whether values[i] is held with a
 *     stamp at most stamp (repeated as of it). One cache miss a value where a sorted table's search is a
 *     dozen unpredictable steps, and an insertion in place where a sorted one merges.
 *
 * merge_into(keys, values, n, run_keys, run_values)
 *     A run sorted by uint64 key, each key with an 8-byte value, merged into the first n entries of
 *     keys/values (sorted the same way, with room for the run) in place, from the end; the run's
 *     entries after equal keys there: the recent mirror's entries (mirror.py).
 *
 * key_bits_set(bits, keys, shift), key_bits_test(bits, keys, shift, out)
 *     The recent mirror's presence map (mirror._KeyBits): bit (key >> shift) & (8 * len(bits) - 1)
 *     of the uint8 array bits set for every uint64 key, or tested into out (one byte a key, 0 or 1).
 *
 * sort_entries(keys, values)
 *     uint64 keys, each with an 8-byte value, sorted by key in place, equal keys in the order given
 *     (a stable radix sort): a batch's entries of the recent mirror (mirror.py).
 *
 * band_slots_sorted(keys, bands, out_slots, out_rows, out_bands) -> bool
 *     lsh.sorted_slots of a batch's (rows x bands) uint64 band keys: every (band << 32 | key) slot
 *     sorted, equal slots in row order, with the row (int64) and band (uint16) of each; band by band,
 *     each band's keys radix sorted with their rows in one word. False (nothing written) if a key
 *     does not fit in 32 bits or there are 2**31 rows or more: the caller sorts them itself.
 *
 * kept_entries(slots, rows, serial_of, out_slots, out_serials) -> int
 *     The entries (slot, serial) of a batch's kept documents, taken in order from its sorted band slots
 *     (uint64 slots, the int64 row of each): each slot whose row's serial_of (int64, -1: not kept) is
 *     not -1, written into out_slots and out_serials (room for every slot); returns how many
 *     (view._kept_entries). ValueError for a row out of serial_of's range.
 *
 * sorted_matches(keys, asked) -> bytearray of int64
 *     Where the entries of sorted uint64 keys (repeats allowed) whose key is one of sorted unique
 *     asked ones are, ascending: the recent mirror's entries under a batch's band slots.
 *
 * coded_shared(a, data) -> (shared, n)
 *     How many values sorted unique uint32 a shares with the n values of an Elias-Fano coding
 *     (decoded on the way, checked as ef_decode checks it): verify.jaccard of a stored candidate.
 *
 * coded_jaccards(owns, codings, out) -> int
 *     verify.jaccard_coded of each pair (owns[i]: sorted unique uint32, codings[i]: bytes of an
 *     Elias-Fano coding) into out (float64), in one call for a batch's candidates; -1, or the
 *     first i whose coding is not one (out is then written up to it).
 *
 * record_id(data) -> str or None
 *     The id of a packed index record (its first field, as msgpack unpacks it), without unpacking
 *     the rest; None for data of another layout (msgpack then says what it holds).
 *
 * big_endian_keys(serials, width) -> list of bytes
 *     Each int of a list as width (1-8) bytes, big-endian (int.to_bytes(width, "big"): index.u64,
 *     serial_key): the keys a batch's candidates are fetched by. OverflowError for one that does
 *     not fit, as to_bytes raises it.
 *
 * stored_walk(seek, value, next_dup, buckets, firsts, lasts, key_width, value_width) -> bytes
 *     The rows (key then value bytes) of a dupsort table that each asked range holds: for range i (its
 *     bucket key_width bytes of buckets, its bounds value_width bytes of firsts and lasts) the bound
 *     methods of one py-lmdb cursor are called as bands.BandRows.stored_rows' loop calls them: seek
 *     (set_range_dup) at (bucket, first), then value() and next_dup() while the value is at most last
 *     (big-endian bytes of one width compare as their numbers). The same calls, without a Python
 *     frame's work between them: the loop's bytes objects, comparisons and list of rows.
 *
 * row_pairs(keys, values, key_width, value_width) -> list of (bytes, bytes)
 *     Table rows laid end to end (keys: n keys of key_width bytes, values: n values of value_width
 *     bytes) as the (key, value) tuples a cursor's putmulti takes: list(zip(rows_as_bytes(keys),
 *     rows_as_bytes(values))) without numpy's list of bytes and zip's tuples between (a merge's
 *     band entries: about 2.3 million a merge of 100,000 documents, in 4,096 buckets: a key equal to
 *     the row before's is that row's bytes object). ValueError when the sizes do not give n of each.
 *
 * by_serial(pairs) -> dict
 *     py-lmdb getmulti's (key, value) pairs as {int.from_bytes(key, "big"): value} (keys of at most
 *     8 bytes): the candidates' stored codings by serial.
 *
 * record_ids(pairs) -> dict
 *     getmulti's (key, packed record) pairs as {serial: record_id(record)} (None where record_id
 *     gives None): the candidates' ids by serial, in one pass over the fetched records.
 *
 * pack_records(records, numbers) -> list of bytes (None: a record left to msgpack)
 *     Each index.DocRecord packed as DocRecord.pack(number) does, byte for byte (msgpack's default
 *     Packer: str as raw with str8, bytes as bin, floats as doubles, ints in their smallest form),
 *     for a record whose fields are of the types records hold (None, bool, int, float, str, bytes,
 *     a list source); any other type in a record gives None for it.
 *
 * bloom_may_hold(keys, layers, out), bloom_set(keys, (layer,))
 *     The band filter of store/bandfilter.py, exactly: out[i] = 1 if a layer (uint64 words, a power of
 *     two of them) may hold keys[i]; a layer's bits of each key set.
 *
 * index_rows(records, idents, recent_keys, placed) -> (keys, recent, members, exact, entries)
 *     What store.view.write_documents files of each decided record (index.DocRecord, serials in
 *     0..2**32-1), with idents its id hash (bytes): keys, its serial as the docs table keys it
 *     (4 bytes big-endian); recent, (8-byte serial, mirror.pack_recent(ident, content,
 *     recent_keys.get(serial, b""), placed[serial][1] if in placed)); members, (cluster key, key) of
 *     each duplicate, in record order; exact, how many are exact; entries, (serial, ident, content).
 *
 * file_firsts(entries, first_of_id, more_of_id, first_of_content, more_of_content)
 *     The recent mirror's hashes of committed documents (mirror.RecentMirror.add): for each
 *     (serial, id hash, content hash) of entries, in order, each hash's first serial set in its
 *     first_ dict if it has none, else the serial appended to its list in the more_ dict.
 *
 * decision_lines(decisions, line) -> bytes
 *     The decisions file's lines of a batch, joined, each as sinks.files.decision_line writes it
 *     (strings as json's encode_basestring writes them, UTF-8; similarities repr(round(x, 6)), by
 *     Python's round and repr); a decision with a field of another type (not str, not float, a
 *     string that is not valid UTF-8) by calling line(decision) (bytes).
 *
 * record_batches(records, batch_size) -> list of (bytearray, count, first_ts, max_ts, largest record)
 *     Kafka record batches (magic 2, uncompressed) of (timestamp_ms, key, value, headers) records, byte for
 *     byte as kafka-python's DefaultRecordBatchBuilder appends them (zigzag varints, a null key, value or
 *     header value as length -1, header names UTF-8), a batch ending where that builder's would (a record
 *     whose size would take it past batch_size opens the next; the first always fits). Each bytearray begins
 *     with the batch's 61-byte header left zero: the producer's id, epoch and base sequence are known only
 *     when the client sends it, and sink/batches.py writes it and the CRC-32C then.
 *
 * slotted(setters, *values) -> object
 *     An object of the slots class setters[0] with each value written into the slot of setters[1:], the
 *     member descriptors of its fields (one value a field), with no call of its __init__: what the
 *     dataclass's generated __init__ makes of the same values positionally, at a third of its cost.
 *
 * kept_alone(context, start, stop, serial) -> next serial
 *     Items start..stop-1 of a batch, documents whose rows are surely kept (decide._State.alone_rows),
 *     kept as serials from serial, as decide._State.kept_alone keeps one: its DocRecord.new_cluster
 *     and (record, row) in records, its serial filed in by_id and by_content, its Decision in
 *     decisions; the context is decide._State.alone_context's tuple. Rows decided from the store's
 *     evidence alone are taken too (decide._State.quick_rows: see "Rows decided from the store's
 *     evidence" below).
 *
 * consumer_records(buffer, pos, count, base_offset, first_ts, max_ts, timestamp_type, topic, partition,
 *                  leader_epoch, record_type) -> (list, record bytes) or None
 *     The count records of a v2 record batch (its records' bytes from pos to the end of buffer, decompressed),
 *     each a record_type (kafka-python's ConsumerRecord namedtuple) with the fields its fetcher gives one
 *     (timestamps LOG_APPEND_TIME when timestamp_type is 1, no checksum, sizes -1 for a null key or value and
 *     for no headers), and the records' bytes as kafka-python counts them; None when anything is off (a
 *     framing error, a header key that is not UTF-8, bytes left after the last record), for kafka-python's
 *     own reader to take the batch and raise or recover as it does.
 *
 * json_id_keys(values, keys, rejected, field, max_record) -> list of 8-byte keys or None
 *     The sharded signer's placing of JSON records without decoding them: for each record, records.id_key of the
 *     id decode.py gives it (the top-level member field, a string's UTF-8 or an integer's digits), found by one
 *     validating scan of the value (strict JSON, which orjson and json read alike); None wherever the scan
 *     cannot vouch for that (invalid or deeply nested JSON, an id with escapes, null, empty, a float, a long
 *     integer, the field twice, a member name with escapes, a value over max_record bytes, a key that is not
 *     UTF-8, a record rejected as read), for decode.py to decode.
 *
 * Arrays are passed through the buffer protocol (C-contiguous, types checked by itemsize here and
 * by dtype in Python), so the module needs only Python.h to build.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#ifndef Py_T_OBJECT_EX  /* before Python 3.12: structmember.h's names */
#include <structmember.h>
#define Py_T_OBJECT_EX T_OBJECT_EX
#define Py_READONLY READONLY
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define POLY_BASE 0x9E3779B97F4A7C55ULL
#define POLY_BASE_INVERSE 0x568C770A7CF6A0FDULL /* checked at import against pow(POLY_BASE, -1, 2**64) */
#define GOLDEN 0x9E3779B97F4A7C15ULL

static inline uint64_t fmix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDULL;
    x ^= x >> 33;
    x *= 0xC4CEB93FE53B5A61ULL;
    x ^= x >> 33;
    return x;
}

/* Bottom-up merge sort whose merge step picks with a conditional move instead of a branch: shingle
 * hashes are random, so a comparison sort's branches would mispredict half the time (about three
 * times slower on a document's few hundred hashes). Merges runs of width into dst. */
static void merge_runs(const uint64_t *src, uint64_t *dst, Py_ssize_t n, Py_ssize_t width) {
    for (Py_ssize_t lo = 0; lo < n; lo += 2 * width) {
        Py_ssize_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
        Py_ssize_t i = lo, j = mid, o = lo;
        while (i < mid && j < hi) {
            uint64_t x = src[i], y = src[j];
            int right = y < x;
            dst[o++] = right ? y : x;
            i += !right;
            j += right;
        }
        while (i < mid) dst[o++] = src[i++];
        while (j < hi) dst[o++] = src[j++];
    }
}

static void merge_sort(uint64_t *v, uint64_t *tmp, Py_ssize_t n) {
    uint64_t *src = v, *dst = tmp;
    for (Py_ssize_t width = 1; width < n; width *= 2) {
        merge_runs(src, dst, n, width);
        uint64_t *t = src; src = dst; dst = t;
    }
    if (src != v) memcpy(v, src, (size_t)n * sizeof(uint64_t));
}

static void insertion_sort(uint64_t *v, Py_ssize_t n) {
    for (Py_ssize_t i = 1; i < n; i++) {
        uint64_t x = v[i];
        Py_ssize_t j = i;
        while (j > 0 && v[j - 1] > x) { v[j] = v[j - 1]; j--; }
        v[j] = x;
    }
}

#define MAX_BUCKET_BITS 16
#define SMALL_BUCKET 32

/* Shingle hashes are uniform (fmix64), so one pass by their top bits into about one bucket per
 * hash leaves buckets of one or two: an insertion sort finishes each in a few steps. A bucket that
 * is large anyway (the same shingle many times, or crafted hashes) is merge sorted, so the worst
 * case stays n log n. About four times faster than the merge sort alone on a document's hashes. */
static void sort_u64(uint64_t *v, uint64_t *tmp, uint32_t *bucket_end, Py_ssize_t n) {
    if (n <= SMALL_BUCKET) { insertion_sort(v, n); return; }
    int bits = 4;
    while (((Py_ssize_t)1 << bits) < n && bits < MAX_BUCKET_BITS) bits++;
    int shift = 64 - bits;
    size_t buckets = (size_t)1 << bits;
    memset(bucket_end, 0, (buckets + 1) * sizeof(uint32_t));
    for (Py_ssize_t i = 0; i < n; i++) bucket_end[(v[i] >> shift) + 1]++;
    uint32_t largest = 0;
    for (size_t b = 0; b < buckets; b++) {
        largest = bucket_end[b + 1] > largest ? bucket_end[b + 1] : largest;
        bucket_end[b + 1] += bucket_end[b];
    }
    for (Py_ssize_t i = 0; i < n; i++) tmp[bucket_end[v[i] >> shift]++] = v[i];
    memcpy(v, tmp, (size_t)n * sizeof(uint64_t));
    if (largest <= SMALL_BUCKET) {  /* one insertion sort of the whole: a value moves only within its bucket */
        insertion_sort(v, n);
        return;
    }
    Py_ssize_t begin = 0;
    for (size_t b = 0; b < buckets; b++) {
        Py_ssize_t end = bucket_end[b], size = end - begin;
        if (size > SMALL_BUCKET) merge_sort(v + begin, tmp, size);
        else if (size > 1) insertion_sort(v + begin, size);
        begin = end;
    }
}

static Py_ssize_t sort_unique(uint64_t *v, uint64_t *tmp, uint32_t *bucket_end, Py_ssize_t n) {
    if (n == 0) return 0;
    sort_u64(v, tmp, bucket_end, n);
    Py_ssize_t kept = 1;
    for (Py_ssize_t i = 1; i < n; i++) {
        v[kept] = v[i];
        kept += v[i] != v[kept - 1];
    }
    return kept;
}

static int get_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, int writable, const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) return -1;
    if (view->len % itemsize) {
        PyErr_Format(PyExc_TypeError, "%s: expected items of %zd bytes", name, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* Hashes of one document's shingles (unsorted) into out; returns how many. powers[i] = P**i and
 * inverse[i] = P**-i (mod 2**64) for i up to the document's length; prefix, unit_begin and
 * unit_end have room for length + 1. One pass finds the words (without branches: word edges are
 * as unpredictable as the text) and the prefix sums of the polynomial hash. */
static Py_ssize_t document_shingles(const uint32_t *p, Py_ssize_t length, int kind_word, Py_ssize_t k,
                                    const uint64_t *powers, const uint64_t *inverse, uint64_t *prefix,
                                    Py_ssize_t *unit_begin, Py_ssize_t *unit_end, uint64_t *out) {
    uint64_t sum = 0;
    Py_ssize_t units = 0;
    if (kind_word) {
        Py_ssize_t ends = 0;
        int previous_space = 1;
        for (Py_ssize_t i = 0; i < length; i++) {
            uint32_t c = p[i];
            prefix[i] = sum;
            sum += (uint64_t)c * powers[i];
            int space = (c == 32) | (c == 0);
            unit_begin[units] = i;
            units += previous_space & (!space);
            unit_end[ends] = i;
            ends += (!previous_space) & space;
            previous_space = space;
        }
        if (!previous_space) unit_end[ends] = length;
    } else {
        for (Py_ssize_t i = 0; i < length; i++) {
            prefix[i] = sum;
            sum += (uint64_t)p[i] * powers[i];
            unit_begin[i] = i;
            unit_end[i] = i + 1;
        }
        units = length;
    }
    prefix[length] = sum;
    if (units == 0) return 0;
    Py_ssize_t grams = units >= k ? units - k + 1 : 1;
    for (Py_ssize_t g = 0; g < grams; g++) {
        Py_ssize_t last = g + k <= units ? g + k - 1 : units - 1;
        Py_ssize_t begin = unit_begin[g], end = unit_end[last];
        uint64_t poly = (prefix[end] - prefix[begin]) * inverse[begin];
        out[g] = fmix64(poly ^ ((uint64_t)(end - begin) * GOLDEN));
    }
    return grams;
}

/* document_shingles of a normalized ASCII document's words (prepare_ascii's: words of a-z and 0-9, one space
 * between two, none before or after; length > 0), the same hashes. One pass over the bytes notes only where each
 * space is and the polynomial's prefix sum there (no code points widened, no prefix sum kept for every byte);
 * a word's begin and end and their prefix sums follow from its spaces. space_at and space_sum have room for
 * length + 1. */
static Py_ssize_t ascii_word_shingles(const unsigned char *p, Py_ssize_t length, Py_ssize_t k,
                                      const uint64_t *powers, const uint64_t *inverse, Py_ssize_t *space_at,
                                      uint64_t *space_sum, uint64_t *out) {
    uint64_t sum = 0;
    Py_ssize_t spaces = 0;
    for (Py_ssize_t i = 0; i < length; i++) {
        uint64_t c = p[i];
        space_at[spaces] = i;
        space_sum[spaces] = sum;
        spaces += c == ' ';
        sum += c * powers[i];
    }
    Py_ssize_t units = spaces + 1;
    Py_ssize_t grams = units >= k ? units - k + 1 : 1;
    for (Py_ssize_t g = 0; g < grams; g++) {
        Py_ssize_t last = g + k <= units ? g + k - 1 : units - 1;
        Py_ssize_t begin = g ? space_at[g - 1] + 1 : 0, end = last < spaces ? space_at[last] : length;
        uint64_t from = g ? space_sum[g - 1] + (uint64_t)' ' * powers[begin - 1] : 0;
        uint64_t to = last < spaces ? space_sum[last] : sum;
        uint64_t poly = (to - from) * inverse[begin];
        out[g] = fmix64(poly ^ ((uint64_t)(end - begin) * GOLDEN));
    }
    return grams;
}

static PyObject *shingles(PyObject *self, PyObject *args) {
    PyObject *o_points, *o_starts, *o_lengths, *o_hashes, *o_offsets;
    int kind_word;
    Py_ssize_t k;
    if (!PyArg_ParseTuple(args, "OOOpnOO", &o_points, &o_starts, &o_lengths, &kind_word, &k, &o_hashes, &o_offsets))
        return NULL;
    if (k < 1) return PyErr_Format(PyExc_ValueError, "k must be at least 1");
    Py_buffer points, starts, lengths, hashes, offsets;
    if (get_buffer(o_points, &points, 4, 0, "points") < 0) return NULL;
    if (get_buffer(o_starts, &starts, 8, 0, "starts") < 0) goto fail0;
    if (get_buffer(o_lengths, &lengths, 8, 0, "lengths") < 0) goto fail1;
    if (get_buffer(o_hashes, &hashes, 8, 1, "hashes") < 0) goto fail2;
    if (get_buffer(o_offsets, &offsets, 8, 1, "offsets") < 0) goto fail3;
    Py_ssize_t n_docs = starts.len / 8, n_points = points.len / 4, room = hashes.len / 8;
    const uint32_t *p = points.buf;
    const int64_t *st = starts.buf, *ln = lengths.buf;
    int64_t *off = offsets.buf;
    uint64_t *out = hashes.buf;
    Py_ssize_t longest = 0;
    if (lengths.len / 8 != n_docs || offsets.len / 8 != n_docs + 1) {
        PyErr_SetString(PyExc_ValueError, "starts, lengths and offsets disagree on the number of documents");
        goto fail4;
    }
    for (Py_ssize_t d = 0; d < n_docs; d++) {
        if (ln[d] < 0 || st[d] < 0 || st[d] + ln[d] > n_points) {
            PyErr_SetString(PyExc_ValueError, "a document lies outside the code points");
            goto fail4;
        }
        if (ln[d] > longest) longest = ln[d];
    }
    uint64_t *scratch = malloc((size_t)(longest + 1) * 4 * sizeof(uint64_t));
    Py_ssize_t *units = malloc((size_t)(longest + 1) * 2 * sizeof(Py_ssize_t));
    uint32_t *bucket_end = malloc(((1 << MAX_BUCKET_BITS) + 1) * sizeof(uint32_t));
    if (!scratch || !units || !bucket_end) {
        free(scratch); free(units); free(bucket_end);
        PyErr_NoMemory();
        goto fail4;
    }
    Py_ssize_t written = 0;
    int overflow = 0;
    Py_BEGIN_ALLOW_THREADS
    uint64_t *powers = scratch, *inverse = scratch + (longest + 1), *prefix = scratch + 2 * (longest + 1);
    uint64_t *sort_space = scratch + 3 * (longest + 1);
    powers[0] = inverse[0] = 1;
    for (Py_ssize_t i = 1; i <= longest; i++) {
        powers[i] = powers[i - 1] * POLY_BASE;
        inverse[i] = inverse[i - 1] * POLY_BASE_INVERSE;
    }
    off[0] = 0;
    for (Py_ssize_t d = 0; d < n_docs; d++) {
        if (written + ln[d] + 1 > room) { overflow = 1; break; }
        Py_ssize_t grams = document_shingles(p + st[d], ln[d], kind_word, k, powers, inverse, prefix,
                                             units, units + longest + 1, out + written);
        written += sort_unique(out + written, sort_space, bucket_end, grams);
        off[d + 1] = written;
    }
    Py_END_ALLOW_THREADS
    free(scratch);
    free(units);
    free(bucket_end);
    if (overflow) { PyErr_SetString(PyExc_ValueError, "hashes has no room for every shingle"); goto fail4; }
    PyBuffer_Release(&offsets); PyBuffer_Release(&hashes); PyBuffer_Release(&lengths);
    PyBuffer_Release(&starts); PyBuffer_Release(&points);
    return PyLong_FromSsize_t(written);
fail4: PyBuffer_Release(&offsets);
fail3: PyBuffer_Release(&hashes);
fail2: PyBuffer_Release(&lengths);
fail1: PyBuffer_Release(&starts);
fail0: PyBuffer_Release(&points);
    return NULL;
}

/* The permutations of one document's shingles folded into the running minima, MINHASH_BLOCK permutations at a
 * time: a block's minima and coefficients stay in registers while every shingle passes (the whole 128 did not
 * fit, so each shingle loaded and stored all of them); contiguous lanes, so the compiler vectorizes it; on
 * x86-64 an AVX2 clone is picked at load time when the CPU has it. */
#define MINHASH_BLOCK 32
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
static void minhash_document(const void *h, int wide, Py_ssize_t n, const uint32_t *a, const uint32_t *b,
                             Py_ssize_t num_perm, uint32_t *out) {
    Py_ssize_t q0 = 0;
    for (; q0 + MINHASH_BLOCK <= num_perm; q0 += MINHASH_BLOCK) {
        uint32_t m[MINHASH_BLOCK], pa[MINHASH_BLOCK], pb[MINHASH_BLOCK];
        for (int q = 0; q < MINHASH_BLOCK; q++) {
            m[q] = 0xFFFFFFFFu;
            pa[q] = a[q0 + q];
            pb[q] = b[q0 + q];
        }
        if (wide) {
            for (Py_ssize_t j = 0; j < n; j++) {
                uint32_t x = (uint32_t)(((const uint64_t *)h)[j] >> 32);
                for (int q = 0; q < MINHASH_BLOCK; q++) {
                    uint32_t v = pa[q] * x + pb[q];
                    m[q] = v < m[q] ? v : m[q];
                }
            }
        } else {
            for (Py_ssize_t j = 0; j < n; j++) {
                uint32_t x = ((const uint32_t *)h)[j];
                for (int q = 0; q < MINHASH_BLOCK; q++) {
                    uint32_t v = pa[q] * x + pb[q];
                    m[q] = v < m[q] ? v : m[q];
                }
            }
        }
        for (int q = 0; q < MINHASH_BLOCK; q++) out[q0 + q] = m[q];
    }
    for (Py_ssize_t q = q0; q < num_perm; q++) out[q] = 0xFFFFFFFFu;
    for (Py_ssize_t j = 0; j < n && q0 < num_perm; j++) {
        uint32_t x = wide ? (uint32_t)(((const uint64_t *)h)[j] >> 32) : ((const uint32_t *)h)[j];
        for (Py_ssize_t q = q0; q < num_perm; q++) {
            uint32_t v = a[q] * x + b[q];
            out[q] = v < out[q] ? v : out[q];
        }
    }
}

static PyObject *minhash(PyObject *self, PyObject *args) {
    PyObject *o_hashes, *o_offsets, *o_a, *o_b, *o_out;
    int wide;
    if (!PyArg_ParseTuple(args, "OpOOOO", &o_hashes, &wide, &o_offsets, &o_a, &o_b, &o_out)) return NULL;
    Py_buffer hashes, offsets, a, b, out;
    Py_ssize_t width = wide ? 8 : 4;
    if (get_buffer(o_hashes, &hashes, width, 0, "hashes") < 0) return NULL;
    if (get_buffer(o_offsets, &offsets, 8, 0, "offsets") < 0) goto fail0;
    if (get_buffer(o_a, &a, 4, 0, "a") < 0) goto fail1;
    if (get_buffer(o_b, &b, 4, 0, "b") < 0) goto fail2;
    if (get_buffer(o_out, &out, 4, 1, "out") < 0) goto fail3;
    Py_ssize_t num_perm = a.len / 4, n_docs = offsets.len / 8 - 1, n_hashes = hashes.len / width;
    const int64_t *off = offsets.buf;
    if (b.len / 4 != num_perm || n_docs < 0 || out.len / 4 != n_docs * num_perm) {
        PyErr_SetString(PyExc_ValueError, "a, b, offsets and out disagree on their shapes");
        goto fail4;
    }
    for (Py_ssize_t d = 0; d < n_docs; d++) {
        if (off[d] < 0 || off[d] > off[d + 1] || off[d + 1] > n_hashes) {
            PyErr_SetString(PyExc_ValueError, "offsets must rise within the hashes");
            goto fail4;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t d = 0; d < n_docs; d++)
        minhash_document((const char *)hashes.buf + off[d] * width, wide, off[d + 1] - off[d], a.buf, b.buf, num_perm,
                         (uint32_t *)out.buf + d * num_perm);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&out); PyBuffer_Release(&b); PyBuffer_Release(&a);
    PyBuffer_Release(&offsets); PyBuffer_Release(&hashes);
    Py_RETURN_NONE;
fail4: PyBuffer_Release(&out);
fail3: PyBuffer_Release(&b);
fail2: PyBuffer_Release(&a);
fail1: PyBuffer_Release(&offsets);
fail0: PyBuffer_Release(&hashes);
    return NULL;
}

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* ascii_normalize's class of each byte: letters in lower case, digits, and a space for every other byte. */
static void ascii_classes(unsigned char table[256]) {
    for (int c = 0; c < 256; c++)
        table[c] = (c >= 'A' && c <= 'Z') ? (unsigned char)(c + 32)
                 : ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z')) ? (unsigned char)c : ' ';
}

#if defined(__SSE2__)
/* 16 bytes' classes (ascii_classes) into *classes; the mask of the word bytes among them. Letters are the bytes
 * whose lower case (| 0x20) lies in a-z, digits the bytes in 0-9 (a digit's lower case is itself). */
static inline unsigned word_classes16(const unsigned char *in, __m128i *classes) {
    __m128i x = _mm_loadu_si128((const __m128i *)in);
    __m128i lower = _mm_or_si128(x, _mm_set1_epi8(0x20));
    __m128i from_a = _mm_sub_epi8(lower, _mm_set1_epi8('a')), from_0 = _mm_sub_epi8(x, _mm_set1_epi8('0'));
    __m128i letter = _mm_cmpeq_epi8(_mm_min_epu8(from_a, _mm_set1_epi8(25)), from_a);
    __m128i digit = _mm_cmpeq_epi8(_mm_min_epu8(from_0, _mm_set1_epi8(9)), from_0);
    __m128i word = _mm_or_si128(letter, digit);
    *classes = _mm_or_si128(_mm_and_si128(word, lower), _mm_andnot_si128(word, _mm_set1_epi8(' ')));
    return (unsigned)_mm_movemask_epi8(word);
}
#endif

/* The normalization of a batch of ASCII texts (the texts joined in in, ln[d] bytes each): each document's words in
 * lower case (ascii_classes), one space between two words, a 0 after each document, into o; out_lengths[d] the
 * length of each (without its 0). Returns the bytes written, the 0s included; o has room for the input and a
 * byte a document.
 *
 * A byte at a time, each byte's class deciding the next one's output (a space only before a word that follows
 * non-word bytes, after a first word). Where 16 bytes in a row follow a word byte, hold no two non-word bytes in
 * a row and end on a word byte (or on a non-word byte before a word byte of the same text), they are their own
 * normalization, each non-word byte the one space before its next word: such blocks, most of a page's prose,
 * are classified and stored 16 at a time (SSE2, which every x86-64 CPU has), the same bytes as the loop's. */
static Py_ssize_t normalize_ascii_batch(const unsigned char *in, const int64_t *ln, Py_ssize_t n_docs,
                                        unsigned char *o, int64_t *out_lengths) {
    unsigned char table[256];
    ascii_classes(table);
    Py_ssize_t at = 0, w = 0;
    for (Py_ssize_t d = 0; d < n_docs; d++) {
        Py_ssize_t first = w, end = at + ln[d];
        int previous_word = 0, seen_word = 0;  /* kept off w's chain of additions: one step a byte */
        while (at < end) {
            Py_ssize_t stop = end - at > 16 ? at + 16 : end;
#if defined(__SSE2__)
            if (previous_word && end - at >= 16) {
                __m128i classes;
                unsigned word = word_classes16(in + at, &classes), other = ~word & 0xFFFFu;
                if (!(other & (other >> 1)) && (!(other & 0x8000u) || (end - at > 16 && table[in[at + 16]] != ' '))) {
                    _mm_storeu_si128((__m128i *)(o + w), classes);
                    w += 16;
                    at += 16;
                    continue;  /* previous_word stays 1: a last non-word byte's space is written already */
                }
            }
#endif
            for (; at < stop; at++) {
                unsigned char t = table[in[at]];
                int word = t != ' ';
                o[w] = ' ';
                w += word & (!previous_word) & seen_word;  /* one space before a word that follows spaces */
                o[w] = t;
                w += word;
                seen_word |= word;
                previous_word = word;
            }
        }
        out_lengths[d] = w - first;
        o[w++] = 0;
    }
    return w;
}

static PyObject *ascii_normalize(PyObject *self, PyObject *args) {
    PyObject *o_text, *o_lengths, *o_out, *o_out_lengths;
    if (!PyArg_ParseTuple(args, "OOOO", &o_text, &o_lengths, &o_out, &o_out_lengths)) return NULL;
    Py_buffer text, lengths, out, out_lengths;
    if (get_buffer(o_text, &text, 1, 0, "text") < 0) return NULL;
    if (get_buffer(o_lengths, &lengths, 8, 0, "text_lengths") < 0) goto fail0;
    if (get_buffer(o_out, &out, 1, 1, "out") < 0) goto fail1;
    if (get_buffer(o_out_lengths, &out_lengths, 8, 1, "out_lengths") < 0) goto fail2;
    Py_ssize_t n_docs = lengths.len / 8, total = 0;
    const int64_t *ln = lengths.buf;
    for (Py_ssize_t d = 0; d < n_docs; d++) {
        if (ln[d] < 0) break;
        total += ln[d];
    }
    if (out_lengths.len / 8 != n_docs || total != text.len || out.len < text.len + n_docs) {
        PyErr_SetString(PyExc_ValueError, "text, text_lengths and the outputs disagree on their sizes");
        goto fail3;
    }
    Py_ssize_t w;
    Py_BEGIN_ALLOW_THREADS
    w = normalize_ascii_batch(text.buf, ln, n_docs, out.buf, out_lengths.buf);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&out_lengths); PyBuffer_Release(&out); PyBuffer_Release(&lengths); PyBuffer_Release(&text);
    return PyLong_FromSsize_t(w > 0 ? w - 1 : 0);
fail3: PyBuffer_Release(&out_lengths);
fail2: PyBuffer_Release(&out);
fail1: PyBuffer_Release(&lengths);
fail0: PyBuffer_Release(&text);
    return NULL;
}

/* Elias-Fano (see eliasfano.py): [L][n as LEB128][n x L low bits, LSB first][upper bits, LSB first] */
static int low_bits_for(Py_ssize_t n) {
    if (n <= 0) return 0;
    uint64_t ratio = (1ULL << 32) / (uint64_t)n;
    return ratio ? 63 - __builtin_clzll(ratio) : 0;
}

/* The coding of n sorted unique values as a new bytes object (NULL with ValueError if they are not). */
static PyObject *ef_encoded(const uint32_t *v, Py_ssize_t n) {
    for (Py_ssize_t i = 1; i < n; i++) {
        if (v[i] <= v[i - 1]) {
            PyErr_SetString(PyExc_ValueError, "Elias-Fano codes sorted unique values only");
            return NULL;
        }
    }
    int low = low_bits_for(n);
    uint64_t top = n ? ((uint64_t)v[n - 1] >> low) : 0;
    Py_ssize_t header = 1, low_bytes = (n * low + 7) / 8, upper_bits = n ? (Py_ssize_t)top + n : 0;
    for (uint64_t rest = (uint64_t)n; rest >= 0x80; rest >>= 7) header++;
    header++;
    Py_ssize_t size = header + low_bytes + (upper_bits + 7) / 8;
    PyObject *result = PyBytes_FromStringAndSize(NULL, size);
    if (!result) return NULL;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(result);
    Py_ssize_t at = 0;
    out[at++] = (uint8_t)low;
    uint64_t rest = (uint64_t)n;
    while (rest >= 0x80) { out[at++] = (uint8_t)(rest | 0x80); rest >>= 7; }
    out[at++] = (uint8_t)rest;
    uint8_t *lows = out + at, *upper = lows + low_bytes;
    memset(upper, 0, size - (upper - out)); /* the low bits' bytes are all written below */
    uint64_t mask = low ? ((1ULL << low) - 1) : 0;
    uint64_t pending = 0; /* low bits not written yet, the next bytes' first (at most 31 + 32 of them) */
    int held = 0;
    uint8_t *low_at = lows;
    for (Py_ssize_t i = 0; i < n; i++) {
        pending |= ((uint64_t)v[i] & mask) << held;
        held += low;
        if (held >= 32) { /* four bytes at once, least significant first */
            low_at[0] = (uint8_t)pending; low_at[1] = (uint8_t)(pending >> 8);
            low_at[2] = (uint8_t)(pending >> 16); low_at[3] = (uint8_t)(pending >> 24);
            low_at += 4;
            pending >>= 32;
            held -= 32;
        }
    }
    while (held > 0) {
        *low_at++ = (uint8_t)pending;
        pending >>= 8;
        held -= 8;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t position = ((uint64_t)v[i] >> low) + (uint64_t)i;
        upper[position >> 3] |= (uint8_t)(1u << (position & 7));
    }
    return result;
}

static PyObject *ef_encode(PyObject *self, PyObject *args) {
    PyObject *o_values;
    if (!PyArg_ParseTuple(args, "O", &o_values)) return NULL;
    Py_buffer values;
    if (get_buffer(o_values, &values, 4, 0, "values") < 0) return NULL;
    PyObject *result = ef_encoded(values.buf, values.len / 4);
    PyBuffer_Release(&values);
    return result;
}

/* Which documents ef_encode_many codes: rows (int64 numbers of documents) or, without them, all; -1 with
 * ValueError for a number out of range. */
static Py_ssize_t coded_rows(PyObject *o_rows, Py_buffer *rows, int *held, Py_ssize_t n_docs) {
    if (o_rows == NULL || o_rows == Py_None) return n_docs;
    if (get_buffer(o_rows, rows, 8, 0, "rows") < 0) return -1;
    *held = 1;
    const int64_t *r = rows->buf;
    Py_ssize_t n = rows->len / 8;
    for (Py_ssize_t i = 0; i < n; i++)
        if (r[i] < 0 || r[i] >= n_docs) {
            PyErr_SetString(PyExc_ValueError, "ef_encode_many: a row out of range");
            return -1;
        }
    return n;
}

static PyObject *ef_encode_many(PyObject *self, PyObject *args) {
    PyObject *o_values, *o_offsets, *o_rows = NULL;
    if (!PyArg_ParseTuple(args, "OO|O", &o_values, &o_offsets, &o_rows)) return NULL;
    Py_buffer values, offsets, rows;
    int held = 0;
    if (get_buffer(o_values, &values, 4, 0, "values") < 0) return NULL;
    if (get_buffer(o_offsets, &offsets, 8, 0, "offsets") < 0) { PyBuffer_Release(&values); return NULL; }
    const int64_t *off = offsets.buf;
    Py_ssize_t n_docs = offsets.len / 8 - 1, n_values = values.len / 4, coded_docs = -1;
    PyObject *result = NULL;
    for (Py_ssize_t d = 0; d < n_docs; d++) {
        if (off[d] < 0 || off[d] > off[d + 1] || off[d + 1] > n_values) {
            PyErr_SetString(PyExc_ValueError, "offsets must rise within the values");
            goto done;
        }
    }
    coded_docs = coded_rows(o_rows, &rows, &held, n_docs > 0 ? n_docs : 0);
    if (coded_docs < 0) goto done;
    const int64_t *which = held ? rows.buf : NULL;
    result = PyList_New(coded_docs);
    for (Py_ssize_t i = 0; result && i < coded_docs; i++) {
        Py_ssize_t d = which ? which[i] : i;
        PyObject *coded = ef_encoded((const uint32_t *)values.buf + off[d], off[d + 1] - off[d]);
        if (!coded) { Py_CLEAR(result); break; }
        PyList_SET_ITEM(result, i, coded);
    }
done:
    if (held) PyBuffer_Release(&rows);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&values);
    return result;
}

/* An Elias-Fano coding's header: L, n and where the low bits begin (-1: not a coding). */
static int ef_header(const uint8_t *in, Py_ssize_t size, int *low_out, uint64_t *n_out, Py_ssize_t *at_out) {
    Py_ssize_t at = 1;
    if (size < 2 || in[0] > 32) return -1;
    int low = in[0];
    uint64_t n = 0;
    for (int shift = 0;; shift += 7) {
        if (at >= size || shift > 35) return -1;
        uint8_t byte = in[at++];
        n |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80)) break;
    }
    Py_ssize_t low_bytes = (Py_ssize_t)((n * low + 7) / 8);
    if (n > (uint64_t)size * 8 || at + low_bytes > size || low != low_bits_for((Py_ssize_t)n)) return -1;
    *low_out = low;
    *n_out = n;
    *at_out = at;
    return 0;
}

/* The n values of a coding (its header read by ef_header) into out (-1: not a coding of sorted unique values). */
static int ef_values(const uint8_t *in, Py_ssize_t size, int low, uint64_t n, Py_ssize_t at, uint32_t *out) {
    Py_ssize_t low_bytes = (Py_ssize_t)((n * low + 7) / 8);
    const uint8_t *lows = in + at, *upper = lows + low_bytes;
    Py_ssize_t upper_bytes = size - at - low_bytes;
    uint64_t i = 0, low_mask = low ? ((1ULL << low) - 1) : 0;
    for (Py_ssize_t byte = 0; byte < upper_bytes && i < n; byte++) {
        unsigned bits = upper[byte];
        while (bits && i < n) {
            uint64_t position = (uint64_t)byte * 8 + __builtin_ctz(bits);
            uint64_t high = position - i, bit = i * low, value = 0;
            if ((Py_ssize_t)(bit >> 3) + 8 <= low_bytes) { /* a whole word there: one unaligned load */
                uint64_t word;
                memcpy(&word, lows + (bit >> 3), 8);
                value = (word >> (bit & 7)) & low_mask;
            } else for (int done = 0; done < low;) {
                int shift = (int)(bit & 7), take = 8 - shift;
                if (take > low - done) take = low - done;
                value |= (uint64_t)((lows[bit >> 3] >> shift) & ((1u << take) - 1)) << done;
                done += take;
                bit += take;
            }
            value |= high << low;
            if (value > 0xFFFFFFFFULL || (i && value <= out[i - 1])) return -1;
            out[i++] = (uint32_t)value;
            bits &= bits - 1;
        }
    }
    return i == n ? 0 : -1;
}

static PyObject *not_a_coding(void) {
    PyErr_SetString(PyExc_ValueError, "not an Elias-Fano coding of sorted unique uint32 values");
    return NULL;
}

static PyObject *ef_decode(PyObject *self, PyObject *args) {
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data)) return NULL;
    const uint8_t *in = data.buf;
    int low;
    uint64_t n;
    Py_ssize_t at;
    if (ef_header(in, data.len, &low, &n, &at) < 0) { PyBuffer_Release(&data); return not_a_coding(); }
    PyObject *result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n * 4);
    if (!result) { PyBuffer_Release(&data); return NULL; }
    if (ef_values(in, data.len, low, n, at, (uint32_t *)PyBytes_AS_STRING(result)) < 0) {
        Py_DECREF(result);
        PyBuffer_Release(&data);
        return not_a_coding();
    }
    PyBuffer_Release(&data);
    return result;
}

/* How many values two sorted unique uint32 arrays share (a merge walk without branches on the values). */
static inline Py_ssize_t sorted_shared(const uint32_t *x, Py_ssize_t n, const uint32_t *y, Py_ssize_t m) {
    Py_ssize_t i = 0, j = 0, shared = 0;
    while (i < n && j < m) {
        uint32_t u = x[i], v = y[j];
        shared += u == v;
        i += u <= v;
        j += v <= u;
    }
    return shared;
}

/* (shared, n): how many values sorted unique uint32 a shares with a coding's, and how many it codes. */
static PyObject *coded_shared(PyObject *self, PyObject *args) {
    PyObject *o_a;
    Py_buffer data, a;
    if (!PyArg_ParseTuple(args, "Oy*", &o_a, &data)) return NULL;
    if (get_buffer(o_a, &a, 4, 0, "a") < 0) { PyBuffer_Release(&data); return NULL; }
    const uint8_t *in = data.buf;
    int low;
    uint64_t n;
    Py_ssize_t at;
    PyObject *result = NULL;
    uint32_t small[1024], *values = small;
    if (ef_header(in, data.len, &low, &n, &at) < 0) { not_a_coding(); goto done; }
    if (n > 1024 && !(values = malloc((size_t)n * 4))) { PyErr_NoMemory(); goto done; }
    if (ef_values(in, data.len, low, n, at, values) < 0) { not_a_coding(); goto done; }
    result = Py_BuildValue("nn", sorted_shared(a.buf, a.len / 4, values, (Py_ssize_t)n), (Py_ssize_t)n);
done:
    if (values != small) free(values);
    PyBuffer_Release(&a);
    PyBuffer_Release(&data);
    return result;
}

/* How many of the m values x shares with the n values coded in in[0:size] (-1: not a coding, -2: no
 * memory); values has room for 1024 and is used if the coding holds no more. */
static Py_ssize_t coded_count(const uint32_t *x, Py_ssize_t m, const uint8_t *in, Py_ssize_t size,
                              uint32_t *small, Py_ssize_t *n_out) {
    int low;
    uint64_t n;
    Py_ssize_t at, shared;
    if (ef_header(in, size, &low, &n, &at) < 0) return -1;
    uint32_t *values = n > 1024 ? malloc((size_t)n * 4) : small;
    if (!values) return -2;
    Py_ssize_t count = (Py_ssize_t)n;
    shared = ef_values(in, size, low, n, at, values) < 0 ? -1 : sorted_shared(x, m, values, count);
    if (values != small) free(values);
    *n_out = count;
    return shared;
}

static PyObject *coded_jaccards(PyObject *self, PyObject *args) {
    PyObject *owns, *codings, *o_out;
    if (!PyArg_ParseTuple(args, "O!O!O", &PyList_Type, &owns, &PyList_Type, &codings, &o_out)) return NULL;
    Py_buffer out;
    if (get_buffer(o_out, &out, 8, 1, "out") < 0) return NULL;
    Py_ssize_t pairs = PyList_GET_SIZE(owns), bad = -1;
    uint32_t small[1024];
    if (PyList_GET_SIZE(codings) != pairs || out.len / 8 != pairs) {
        PyErr_SetString(PyExc_ValueError, "coded_jaccards: owns, codings and out differ in length");
        goto done;
    }
    double *similarity = out.buf;
    for (Py_ssize_t p = 0; p < pairs && bad < 0; p++) {
        PyObject *coding = PyList_GET_ITEM(codings, p);
        if (!PyBytes_Check(coding)) {
            PyErr_SetString(PyExc_TypeError, "coded_jaccards: a coding is not bytes");
            goto done;
        }
        Py_buffer a;
        if (get_buffer(PyList_GET_ITEM(owns, p), &a, 4, 0, "owns") < 0) goto done;
        Py_ssize_t m = a.len / 4, n = 0;
        const uint8_t *data = (const uint8_t *)PyBytes_AS_STRING(coding);
        Py_ssize_t shared = coded_count(a.buf, m, data, PyBytes_GET_SIZE(coding), small, &n);
        PyBuffer_Release(&a);
        if (shared == -2) { PyErr_NoMemory(); goto done; }
        if (shared < 0) { bad = p; break; }
        if (m == 0 || n == 0) similarity[p] = (m == 0 && n == 0) ? 1.0 : 0.0;
        else similarity[p] = (double)shared / (double)(m + n - shared);
    }
done:
    PyBuffer_Release(&out);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromSsize_t(bad);
}

/* The first place of sorted v[0:n] whose value is at least key, knowing that none before from is:
 * doubling steps from there, then a binary search (a walk through sorted keys costs their spread). */
#define LOWER_BOUND_FROM(name, type)                                                 \
    static Py_ssize_t name(const type *v, Py_ssize_t n, type key, Py_ssize_t from) { \
        Py_ssize_t lo = from, hi = from, step = 1;                                   \
        while (hi < n && v[hi] < key) {                                              \
            lo = hi + 1;                                                             \
            hi += step;                                                              \
            step *= 2;                                                               \
        }                                                                            \
        if (hi > n) hi = n;                                                          \
        while (lo < hi) {                                                            \
            Py_ssize_t mid = lo + (hi - lo) / 2;                                     \
            if (v[mid] < key) lo = mid + 1;                                          \
            else hi = mid;                                                           \
        }                                                                            \
        return lo;                                                                   \
    }
LOWER_BOUND_FROM(lower_bound_from, uint64_t)
LOWER_BOUND_FROM(lower_bound_from32, uint32_t)

#define NEAR_VALUES 16 /* a table's values counted whole before a doubling walk (lower_bound_near32) */

/* Whether keys ascending through a sorted table are walked with lower_bound_near32: when the table is 4 to 64
 * times as long as they are many (each key a few places past the last). Closer, the doubling walk's first
 * step or two find most keys; farther, its doubling steps do. */
static inline int walk_near(Py_ssize_t keys, Py_ssize_t table) {
    return table >= 4 * keys && table <= 64 * keys;
}

/* lower_bound_from32 for keys that ascend through a table a few times as long (a page's values through its
 * site's recent shingles, a page's new values merged into those): the next NEAR_VALUES values counted without
 * a branch (the place is how many are below key), the doubling walk only past them. Each step of that walk
 * is a branch the processor cannot foresee. */
static inline Py_ssize_t lower_bound_near32(const uint32_t *v, Py_ssize_t n, uint32_t key, Py_ssize_t from) {
    if (from + NEAR_VALUES <= n) {
        int below = 0;
        for (int k = 0; k < NEAR_VALUES; k++) below += v[from + k] < key;
        if (below < NEAR_VALUES) return from + below;
        from += NEAR_VALUES;
    }
    return lower_bound_from32(v, n, key, from);
}

/* Whether v[0:n] never descends (every value compared: no branch a value). */
static int never_descends(const uint32_t *v, Py_ssize_t n) {
    int bad = 0;
    for (Py_ssize_t k = 1; k < n; k++) bad |= v[k] < v[k - 1];
    return !bad;
}

/* Whether ascending values are marked through a table by one merge of the two (mark_merged): when the table is
 * at most 4 times as long as they are many and at least an eighth (a page against its site's template or the
 * shared one, against another page). There each value moves the walk's place by a step or none, a branch the
 * processor cannot foresee; a merge moves two places by comparisons, with no branch but the loop's. */
static inline int merge_close(Py_ssize_t keys, Py_ssize_t table) {
    return table < 4 * keys && 8 * table >= keys && keys >= 16;
}

/* o[i] |= whether v[i] is in sorted t[0:m], for v that never descends: one branch-free merge of the two. */
static void mark_merged(const uint32_t *v, Py_ssize_t n, const uint32_t *t, Py_ssize_t m, uint8_t *o) {
    Py_ssize_t i = 0, j = 0;
    while (i < n && j < m) {
        uint32_t a = v[i], b = t[j];
        o[i] |= a == b;
        i += a <= b;
        j += b < a;
    }
}

/* o[i] |= whether v[i] is in sorted t[0:m]: a doubling walk through the table while the values ascend, a
 * binary search from its start where they do not (a merge where both are of close sizes and the values never
 * descend). */
static void mark_members(const uint32_t *v, Py_ssize_t n, const uint32_t *t, Py_ssize_t m, uint8_t *o) {
    Py_ssize_t from = 0;
    if (merge_close(n, m) && never_descends(v, n)) {
        mark_merged(v, n, t, m, o);
        return;
    }
    if (walk_near(n, m)) {
        for (Py_ssize_t i = 0; i < n; i++) {
            uint32_t key = v[i];
            from = lower_bound_near32(t, m, key, i && key < v[i - 1] ? 0 : from);
            o[i] |= from < m && t[from] == key;
        }
        return;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t key = v[i];
        from = lower_bound_from32(t, m, key, i && key < v[i - 1] ? 0 : from);
        o[i] |= from < m && t[from] == key;
    }
}

static PyObject *sorted_member(PyObject *self, PyObject *args) {
    PyObject *o_values, *o_table, *o_out;
    if (!PyArg_ParseTuple(args, "OOO", &o_values, &o_table, &o_out)) return NULL;
    Py_buffer values, table, out;
    if (get_buffer(o_values, &values, 4, 0, "values") < 0) return NULL;
    if (get_buffer(o_table, &table, 4, 0, "table") < 0) { PyBuffer_Release(&values); return NULL; }
    if (get_buffer(o_out, &out, 1, 1, "out") < 0) {
        PyBuffer_Release(&table);
        PyBuffer_Release(&values);
        return NULL;
    }
    if (out.len != values.len / 4) {
        PyErr_SetString(PyExc_ValueError, "sorted_member: out must have one byte a value");
    } else {
        memset(out.buf, 0, out.len);
        mark_members(values.buf, values.len / 4, table.buf, table.len / 4, out.buf);
    }
    PyBuffer_Release(&out);
    PyBuffer_Release(&table);
    PyBuffer_Release(&values);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

static PyObject *sorted_without(PyObject *self, PyObject *args) {
    PyObject *o_values, *o_table, *o_shared, *o_out;
    if (!PyArg_ParseTuple(args, "OOOO", &o_values, &o_table, &o_shared, &o_out)) return NULL;
    Py_buffer values, table, shared, out;
    Py_ssize_t kept = -1;
    if (get_buffer(o_values, &values, 4, 0, "values") < 0) return NULL;
    if (get_buffer(o_table, &table, 4, 0, "table") < 0) goto release1;
    if (get_buffer(o_shared, &shared, 4, 0, "shared") < 0) goto release2;
    if (get_buffer(o_out, &out, 4, 1, "out") < 0) goto release3;
    Py_ssize_t n = values.len / 4;
    uint8_t *drop = out.len < values.len ? NULL : calloc(n ? n : 1, 1);
    if (!drop) {
        if (out.len < values.len) PyErr_SetString(PyExc_ValueError, "sorted_without: out must have room for every value");
        else PyErr_NoMemory();
    } else {
        const uint32_t *v = values.buf;
        uint32_t *o = out.buf;
        mark_members(v, n, table.buf, table.len / 4, drop);
        mark_members(v, n, shared.buf, shared.len / 4, drop);
        kept = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            o[kept] = v[i];
            kept += !drop[i];
        }
        free(drop);
    }
    PyBuffer_Release(&out);
release3:
    PyBuffer_Release(&shared);
release2:
    PyBuffer_Release(&table);
release1:
    PyBuffer_Release(&values);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromSsize_t(kept);
}

/* sorted_without's two answers in one walk of the values: those not in table (into rest) and those in neither
 * table (into kept); (how many of each). A new page's part its site counts (without its template) and its
 * content (without the shared template too). */
static PyObject *sorted_without_each(PyObject *self, PyObject *args) {
    PyObject *o_values, *o_table, *o_shared, *o_rest, *o_kept, *result = NULL;
    if (!PyArg_ParseTuple(args, "OOOOO", &o_values, &o_table, &o_shared, &o_rest, &o_kept)) return NULL;
    Py_buffer values, table, shared, rest, kept;
    if (get_buffer(o_values, &values, 4, 0, "values") < 0) return NULL;
    if (get_buffer(o_table, &table, 4, 0, "table") < 0) goto release1;
    if (get_buffer(o_shared, &shared, 4, 0, "shared") < 0) goto release2;
    if (get_buffer(o_rest, &rest, 4, 1, "rest") < 0) goto release3;
    if (get_buffer(o_kept, &kept, 4, 1, "kept") < 0) goto release4;
    Py_ssize_t n = values.len / 4;
    uint8_t *marks = rest.len < values.len || kept.len < values.len ? NULL : calloc(n ? 2 * n : 1, 1);
    if (!marks) {
        if (rest.len < values.len || kept.len < values.len)
            PyErr_SetString(PyExc_ValueError, "sorted_without_each: rest and kept must have room for every value");
        else PyErr_NoMemory();
    } else {
        const uint32_t *v = values.buf;
        uint32_t *r = rest.buf, *k = kept.buf;
        uint8_t *templated = marks, *either = marks + n;
        mark_members(v, n, table.buf, table.len / 4, templated);
        mark_members(v, n, shared.buf, shared.len / 4, either);
        Py_ssize_t rested = 0, left = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            r[rested] = v[i];
            rested += !templated[i];
            k[left] = v[i];
            left += !(templated[i] | either[i]);
        }
        free(marks);
        result = Py_BuildValue("nn", rested, left);
    }
    PyBuffer_Release(&kept);
release4:
    PyBuffer_Release(&rest);
release3:
    PyBuffer_Release(&shared);
release2:
    PyBuffer_Release(&table);
release1:
    PyBuffer_Release(&values);
    return result;
}

/* Whether v[0:n] is strictly increasing (every value compared: no branch a value). */
static int strictly_increasing(const uint32_t *v, Py_ssize_t n) {
    int bad = 0;
    for (Py_ssize_t k = 1; k < n; k++) bad |= v[k] <= v[k - 1];
    return !bad;
}

/* The union of strictly increasing x[0:n] and y[0:m] into o, y's values put one by one between the runs of x
 * copied whole (a merge costs a copy of the larger array, not a step a value); how many. */
static Py_ssize_t union_by_runs(const uint32_t *x, Py_ssize_t n, const uint32_t *y, Py_ssize_t m, uint32_t *o) {
    Py_ssize_t i = 0, w = 0;
    int near = walk_near(m, n);
    for (Py_ssize_t j = 0; j < m; j++) {
        uint32_t v = y[j];
        Py_ssize_t at = near ? lower_bound_near32(x, n, v, i) : lower_bound_from32(x, n, v, i);
        memcpy(o + w, x + i, (size_t)(at - i) * 4);
        w += at - i;
        i = at + (at < n && x[at] == v);
        o[w++] = v;
    }
    memcpy(o + w, x + i, (size_t)(n - i) * 4);
    return w + n - i;
}

/* The sorted union of two sorted uint32 arrays, each value once, written to out (room for both); how many,
 * or -1 when an array is not sorted (templates._merged then sorts them). Two strictly increasing arrays (a
 * site's few hundred new shingles and its tens of thousands) are merged by runs (union_by_runs), others a
 * value at a time. */
static PyObject *sorted_union(PyObject *self, PyObject *args) {
    PyObject *o_a, *o_b, *o_out;
    if (!PyArg_ParseTuple(args, "OOO", &o_a, &o_b, &o_out)) return NULL;
    Py_buffer a, b, out;
    Py_ssize_t written = -1;
    if (get_buffer(o_a, &a, 4, 0, "a") < 0) return NULL;
    if (get_buffer(o_b, &b, 4, 0, "b") < 0) goto release_a;
    if (get_buffer(o_out, &out, 4, 1, "out") < 0) goto release_b;
    const uint32_t *x = a.buf, *y = b.buf;
    uint32_t *o = out.buf;
    Py_ssize_t n = a.len / 4, m = b.len / 4, i = 0, j = 0;
    if (out.len < a.len + b.len) {
        PyErr_SetString(PyExc_ValueError, "sorted_union: out must have room for both arrays");
        goto release_out;
    }
    if (strictly_increasing(x, n) && strictly_increasing(y, m)) {
        written = n >= m ? union_by_runs(x, n, y, m, o) : union_by_runs(y, m, x, n, o);
        goto release_out;
    }
    for (Py_ssize_t k = 1; k < n; k++) if (x[k] < x[k - 1]) goto release_out;
    for (Py_ssize_t k = 1; k < m; k++) if (y[k] < y[k - 1]) goto release_out;
    written = 0;
    while (i < n || j < m) {
        uint32_t v = (j >= m || (i < n && x[i] <= y[j])) ? x[i++] : y[j++];
        if (written == 0 || o[written - 1] != v) o[written++] = v;
    }
release_out:
    PyBuffer_Release(&out);
release_b:
    PyBuffer_Release(&b);
release_a:
    PyBuffer_Release(&a);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromSsize_t(written);
}

/* How many values two sorted unique uint32 arrays share (a merge walk; both are a page's few hundred). */
static PyObject *shared_count(PyObject *self, PyObject *args) {
    PyObject *o_a, *o_b;
    if (!PyArg_ParseTuple(args, "OO", &o_a, &o_b)) return NULL;
    Py_buffer a, b;
    if (get_buffer(o_a, &a, 4, 0, "a") < 0) return NULL;
    if (get_buffer(o_b, &b, 4, 0, "b") < 0) { PyBuffer_Release(&a); return NULL; }
    Py_ssize_t shared = sorted_shared(a.buf, a.len / 4, b.buf, b.len / 4);
    PyBuffer_Release(&b);
    PyBuffer_Release(&a);
    return PyLong_FromSsize_t(shared);
}

/* The Jaccard of each pair of sorted unique uint32 arrays (owns[p], others[p]) into out[p] (float64), as
 * verify.jaccard gives it: a batch's templated pairs, gathered, compared in one call. */
static PyObject *jaccards(PyObject *self, PyObject *args) {
    PyObject *owns, *others, *o_out;
    if (!PyArg_ParseTuple(args, "O!O!O", &PyList_Type, &owns, &PyList_Type, &others, &o_out)) return NULL;
    Py_buffer out;
    if (get_buffer(o_out, &out, 8, 1, "out") < 0) return NULL;
    Py_ssize_t pairs = PyList_GET_SIZE(owns);
    if (PyList_GET_SIZE(others) != pairs || out.len / 8 != pairs) {
        PyErr_SetString(PyExc_ValueError, "jaccards: owns, others and out differ in length");
        goto done;
    }
    double *similarity = out.buf;
    for (Py_ssize_t p = 0; p < pairs; p++) {
        Py_buffer a, b;
        if (get_buffer(PyList_GET_ITEM(owns, p), &a, 4, 0, "owns") < 0) goto done;
        if (get_buffer(PyList_GET_ITEM(others, p), &b, 4, 0, "others") < 0) { PyBuffer_Release(&a); goto done; }
        Py_ssize_t n = a.len / 4, m = b.len / 4, shared = sorted_shared(a.buf, n, b.buf, m);
        PyBuffer_Release(&b);
        PyBuffer_Release(&a);
        if (n == 0 || m == 0) similarity[p] = (n == 0 && m == 0) ? 1.0 : 0.0;
        else similarity[p] = (double)shared / (double)(n + m - shared);
    }
done:
    PyBuffer_Release(&out);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* templates.content_of of each of values[i] (sorted uint32) against tables[i] and shareds[i]: the values in
 * neither, written one item after another into out, and sizes[i] how many, or -1 where content_of gives the
 * values themselves (nothing to leave out; all of them, none, or less than min_share of them left). A batch's
 * stored candidates' contents, gathered, made in one call. */
static PyObject *contents_without(PyObject *self, PyObject *args) {
    PyObject *o_values, *o_tables, *o_shareds, *o_out, *o_sizes;
    double min_share;
    if (!PyArg_ParseTuple(args, "O!O!O!dOO", &PyList_Type, &o_values, &PyList_Type, &o_tables, &PyList_Type,
                          &o_shareds, &min_share, &o_out, &o_sizes)) return NULL;
    Py_buffer out, sizes;
    if (get_buffer(o_out, &out, 4, 1, "out") < 0) return NULL;
    if (get_buffer(o_sizes, &sizes, 8, 1, "sizes") < 0) { PyBuffer_Release(&out); return NULL; }
    Py_ssize_t items = PyList_GET_SIZE(o_values), room = out.len / 4, pos = 0;
    uint8_t *drop = NULL;
    Py_ssize_t drop_room = 0;
    if (PyList_GET_SIZE(o_tables) != items || PyList_GET_SIZE(o_shareds) != items || sizes.len / 8 != items) {
        PyErr_SetString(PyExc_ValueError, "contents_without: values, tables, shareds and sizes differ in length");
        goto done;
    }
    int64_t *size = sizes.buf;
    uint32_t *o = out.buf;
    for (Py_ssize_t i = 0; i < items; i++) {
        Py_buffer values, table, shared;
        if (get_buffer(PyList_GET_ITEM(o_values, i), &values, 4, 0, "values") < 0) goto done;
        if (get_buffer(PyList_GET_ITEM(o_tables, i), &table, 4, 0, "tables") < 0) {
            PyBuffer_Release(&values);
            goto done;
        }
        if (get_buffer(PyList_GET_ITEM(o_shareds, i), &shared, 4, 0, "shareds") < 0) {
            PyBuffer_Release(&table);
            PyBuffer_Release(&values);
            goto done;
        }
        Py_ssize_t n = values.len / 4, t = table.len / 4, m = shared.len / 4;
        size[i] = -1;
        if ((t || m) && n) {
            if (n > drop_room) {
                free(drop);
                drop_room = n;
                drop = malloc(n);
            }
            if (!drop || pos + n > room) {
                if (drop) PyErr_SetString(PyExc_ValueError, "contents_without: out must have room for every value");
                else PyErr_NoMemory();
                PyBuffer_Release(&shared);
                PyBuffer_Release(&table);
                PyBuffer_Release(&values);
                goto done;
            }
            memset(drop, 0, n);
            const uint32_t *v = values.buf;
            mark_members(v, n, table.buf, t, drop);
            mark_members(v, n, shared.buf, m, drop);
            Py_ssize_t left = 0;
            for (Py_ssize_t k = 0; k < n; k++) {
                o[pos + left] = v[k];
                left += !drop[k];
            }
            if (!(left == n || left == 0 || (double)left < min_share * (double)n)) {
                size[i] = left;
                pos += left;
            }
        }
        PyBuffer_Release(&shared);
        PyBuffer_Release(&table);
        PyBuffer_Release(&values);
    }
done:
    free(drop);
    PyBuffer_Release(&sizes);
    PyBuffer_Release(&out);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromSsize_t(pos);
}

/* A sorted run of (uint64 key, 8-byte value) merged into the first n entries of keys/values, sorted too,
 * in place from the end (their room holds both): its entries after the equal keys there (the recent
 * mirror's entries: mirror.py). Memory already written is reused, none is allocated. */
static PyObject *merge_into(PyObject *self, PyObject *args) {
    PyObject *objects[4];
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "OOnOO", &objects[0], &objects[1], &n, &objects[2], &objects[3])) return NULL;
    static const char *names[4] = {"keys", "values", "run_keys", "run_values"};
    Py_buffer views[4];
    int got = 0;
    for (; got < 4; got++)
        if (get_buffer(objects[got], &views[got], 8, got < 2, names[got]) < 0) goto done;
    Py_ssize_t m = views[2].len / 8;
    if (n < 0 || views[3].len != views[2].len || views[0].len < (n + m) * 8 || views[1].len < (n + m) * 8) {
        PyErr_SetString(PyExc_ValueError, "merge_into: no room for the run, or its keys and values differ");
        goto done;
    }
    uint64_t *keys = views[0].buf, *values = views[1].buf;
    const uint64_t *run_keys = views[2].buf, *run_values = views[3].buf;
    Py_ssize_t i = n - 1, j = m - 1, o = n + m - 1;
    while (j >= 0 && i >= 0) { /* without branches: which side an entry comes from is a coin toss */
        uint64_t x = keys[i], y = run_keys[j];
        int mine = x > y;
        uint64_t value = mine ? values[i] : run_values[j];
        keys[o] = mine ? x : y;
        values[o--] = value;
        i -= mine;
        j -= !mine;
    }
    if (j >= 0) {
        memcpy(keys, run_keys, (j + 1) * 8);
        memcpy(values, run_values, (j + 1) * 8);
    }
done:
    for (int k = 0; k < got; k++) PyBuffer_Release(&views[k]);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* BLAKE2b (RFC 7693), unkeyed, as hashlib.blake2b(data, digest_size=outlen) computes it: the content
 * hash of a normalized document (shingle.content_hash), made here with the document's other hashes. */
static const uint64_t blake2b_iv[8] = {
    0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL, 0xa54ff53a5f1d36f1ULL,
    0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL, 0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL};
static const uint8_t blake2b_sigma[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4}, {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13}, {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11}, {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5}, {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3}};

static inline uint64_t rotr64(uint64_t x, int n) { return (x >> n) | (x << (64 - n)); }

static inline uint64_t load64_le(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i]; /* one load on a little-endian machine (gcc -O2) */
    return v;
}

#define B2B_G(a, b, c, d, x, y)          \
    do {                                 \
        v[a] = v[a] + v[b] + (x);        \
        v[d] = rotr64(v[d] ^ v[a], 32);  \
        v[c] = v[c] + v[d];              \
        v[b] = rotr64(v[b] ^ v[c], 24);  \
        v[a] = v[a] + v[b] + (y);        \
        v[d] = rotr64(v[d] ^ v[a], 16);  \
        v[c] = v[c] + v[d];              \
        v[b] = rotr64(v[b] ^ v[c], 63);  \
    } while (0)

/* BLAKE2b's twelve rounds of the mixing step G (one state, or four side by side), written out: each message
 * word's place is then a constant, and m stays in registers. */
#define BLAKE2B_ROUND(G, r)                                                 \
    do {                                                                    \
        G(0, 4, 8, 12, m[blake2b_sigma[r][0]], m[blake2b_sigma[r][1]]);     \
        G(1, 5, 9, 13, m[blake2b_sigma[r][2]], m[blake2b_sigma[r][3]]);     \
        G(2, 6, 10, 14, m[blake2b_sigma[r][4]], m[blake2b_sigma[r][5]]);    \
        G(3, 7, 11, 15, m[blake2b_sigma[r][6]], m[blake2b_sigma[r][7]]);    \
        G(0, 5, 10, 15, m[blake2b_sigma[r][8]], m[blake2b_sigma[r][9]]);    \
        G(1, 6, 11, 12, m[blake2b_sigma[r][10]], m[blake2b_sigma[r][11]]);  \
        G(2, 7, 8, 13, m[blake2b_sigma[r][12]], m[blake2b_sigma[r][13]]);   \
        G(3, 4, 9, 14, m[blake2b_sigma[r][14]], m[blake2b_sigma[r][15]]);   \
    } while (0)
#define BLAKE2B_ROUNDS(G)                                                                      \
    BLAKE2B_ROUND(G, 0); BLAKE2B_ROUND(G, 1); BLAKE2B_ROUND(G, 2); BLAKE2B_ROUND(G, 3);      \
    BLAKE2B_ROUND(G, 4); BLAKE2B_ROUND(G, 5); BLAKE2B_ROUND(G, 6); BLAKE2B_ROUND(G, 7);      \
    BLAKE2B_ROUND(G, 8); BLAKE2B_ROUND(G, 9); BLAKE2B_ROUND(G, 10); BLAKE2B_ROUND(G, 11)

static void blake2b_compress(uint64_t h[8], const unsigned char block[128], uint64_t counter, int last) {
    uint64_t v[16], m[16];
    for (int i = 0; i < 16; i++) m[i] = load64_le(block + 8 * i);
    for (int i = 0; i < 8; i++) { v[i] = h[i]; v[i + 8] = blake2b_iv[i]; }
    v[12] ^= counter; /* the counter's high word stays 0: a document is far below 2**64 bytes */
    if (last) v[14] = ~v[14];
    BLAKE2B_ROUNDS(B2B_G);
    for (int i = 0; i < 8; i++) h[i] ^= v[i] ^ v[i + 8];
}

/* blake2b's steps from a state h that has taken the first counter bytes of a message on: the rest of it (n bytes
 * at in), its last block, the digest into out. */
static void blake2b_finish(uint64_t h[8], const unsigned char *in, Py_ssize_t n, uint64_t counter, unsigned char *out,
                           int outlen) {
    unsigned char block[128];
    while (n > 128) {
        counter += 128;
        blake2b_compress(h, in, counter, 0);
        in += 128;
        n -= 128;
    }
    memset(block, 0, sizeof block);
    if (n) memcpy(block, in, (size_t)n);
    counter += (uint64_t)n;
    blake2b_compress(h, block, counter, 1);
    for (int i = 0; i < outlen; i++) out[i] = (unsigned char)(h[i / 8] >> (8 * (i % 8)));
}

static void blake2b(const unsigned char *in, Py_ssize_t n, unsigned char *out, int outlen) {
    uint64_t h[8];
    for (int i = 0; i < 8; i++) h[i] = blake2b_iv[i];
    h[0] ^= 0x01010000ULL ^ (uint64_t)outlen;
    blake2b_finish(h, in, n, 0, out, outlen);
}

/* BLAKE2b of four messages at once, each 64-bit lane of an AVX2 register one message's word: the same rounds,
 * four times the work a step (a page's content hash was a fifth of preparing). Picked at run time on a CPU with
 * AVX2 (blake2b_many); the compiler builds only this function for it, so the module runs on any x86-64. */
#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define HAVE_BLAKE2B_X4 1

__attribute__((target("avx2"))) static inline __m256i b2x4_rotr(__m256i x, int n) {
    if (n == 32) return _mm256_shuffle_epi32(x, _MM_SHUFFLE(2, 3, 0, 1));
    if (n == 24)
        return _mm256_shuffle_epi8(x, _mm256_setr_epi8(3, 4, 5, 6, 7, 0, 1, 2, 11, 12, 13, 14, 15, 8, 9, 10, 3, 4, 5,
                                                       6, 7, 0, 1, 2, 11, 12, 13, 14, 15, 8, 9, 10));
    if (n == 16)
        return _mm256_shuffle_epi8(x, _mm256_setr_epi8(2, 3, 4, 5, 6, 7, 0, 1, 10, 11, 12, 13, 14, 15, 8, 9, 2, 3, 4,
                                                       5, 6, 7, 0, 1, 10, 11, 12, 13, 14, 15, 8, 9));
    return _mm256_or_si256(_mm256_srli_epi64(x, 63), _mm256_add_epi64(x, x)); /* 63 */
}

#define B2X4_G(a, b, c, d, x, y)                                                             \
    do {                                                                                     \
        v[a] = _mm256_add_epi64(_mm256_add_epi64(v[a], v[b]), (x));                          \
        v[d] = b2x4_rotr(_mm256_xor_si256(v[d], v[a]), 32);                                  \
        v[c] = _mm256_add_epi64(v[c], v[d]);                                                 \
        v[b] = b2x4_rotr(_mm256_xor_si256(v[b], v[c]), 24);                                  \
        v[a] = _mm256_add_epi64(_mm256_add_epi64(v[a], v[b]), (y));                          \
        v[d] = b2x4_rotr(_mm256_xor_si256(v[d], v[a]), 16);                                  \
        v[c] = _mm256_add_epi64(v[c], v[d]);                                                 \
        v[b] = b2x4_rotr(_mm256_xor_si256(v[b], v[c]), 63);                                  \
    } while (0)

/* One compression of a block of each of four messages (block[j], 128 bytes), each with its counter and its
 * last-block flag (all ones or 0) in its lane. */
__attribute__((target("avx2"))) static void blake2b_compress_x4(__m256i h[8], const unsigned char *const block[4],
                                                                __m256i counter, __m256i last) {
    __m256i m[16], v[16];
    for (int g = 0; g < 4; g++) { /* four words of each message, transposed: m[w] holds word w of the four */
        __m256i a0 = _mm256_loadu_si256((const __m256i *)(block[0] + 32 * g));
        __m256i a1 = _mm256_loadu_si256((const __m256i *)(block[1] + 32 * g));
        __m256i a2 = _mm256_loadu_si256((const __m256i *)(block[2] + 32 * g));
        __m256i a3 = _mm256_loadu_si256((const __m256i *)(block[3] + 32 * g));
        __m256i t0 = _mm256_unpacklo_epi64(a0, a1), t1 = _mm256_unpackhi_epi64(a0, a1);
        __m256i t2 = _mm256_unpacklo_epi64(a2, a3), t3 = _mm256_unpackhi_epi64(a2, a3);
        m[4 * g] = _mm256_permute2x128_si256(t0, t2, 0x20);
        m[4 * g + 1] = _mm256_permute2x128_si256(t1, t3, 0x20);
        m[4 * g + 2] = _mm256_permute2x128_si256(t0, t2, 0x31);
        m[4 * g + 3] = _mm256_permute2x128_si256(t1, t3, 0x31);
    }
    for (int i = 0; i < 8; i++) {
        v[i] = h[i];
        v[i + 8] = _mm256_set1_epi64x((long long)blake2b_iv[i]);
    }
    v[12] = _mm256_xor_si256(v[12], counter);
    v[14] = _mm256_xor_si256(v[14], last);
    BLAKE2B_ROUNDS(B2X4_G);
    for (int i = 0; i < 8; i++) h[i] = _mm256_xor_si256(h[i], _mm256_xor_si256(v[i], v[i + 8]));
}
#undef B2X4_G

/* blake2b of the four messages in[j] (n[j] bytes) into out[j]: their blocks side by side while each still has
 * one, a message's last block padded as blake2b pads it; what is left of the longer ones, one at a time. */
__attribute__((target("avx2"))) static void blake2b_x4(const unsigned char *const in[4], const Py_ssize_t n[4],
                                                       unsigned char *const out[4], int outlen) {
    Py_ssize_t blocks[4], together = -1;
    for (int j = 0; j < 4; j++) {
        blocks[j] = n[j] ? (n[j] + 127) / 128 : 1;
        together = together < 0 || blocks[j] < together ? blocks[j] : together;
    }
    __m256i h[8];
    for (int i = 0; i < 8; i++)
        h[i] = _mm256_set1_epi64x((long long)(blake2b_iv[i] ^ (i == 0 ? 0x01010000ULL ^ (uint64_t)outlen : 0)));
    unsigned char padded[4][128];
    for (Py_ssize_t s = 0; s < together; s++) {
        const unsigned char *block[4];
        long long counter[4], last[4];
        for (int j = 0; j < 4; j++) {
            if (s < blocks[j] - 1) {
                block[j] = in[j] + 128 * s;
                counter[j] = 128 * (s + 1);
                last[j] = 0;
            } else { /* the message's last block */
                memset(padded[j], 0, 128);
                if (n[j] > 128 * s) memcpy(padded[j], in[j] + 128 * s, (size_t)(n[j] - 128 * s));
                block[j] = padded[j];
                counter[j] = n[j];
                last[j] = -1;
            }
        }
        blake2b_compress_x4(h, block, _mm256_setr_epi64x(counter[0], counter[1], counter[2], counter[3]),
                            _mm256_setr_epi64x(last[0], last[1], last[2], last[3]));
    }
    uint64_t lanes[8][4];
    for (int i = 0; i < 8; i++) _mm256_storeu_si256((__m256i *)lanes[i], h[i]);
    for (int j = 0; j < 4; j++) {
        uint64_t hj[8];
        for (int i = 0; i < 8; i++) hj[i] = lanes[i][j];
        if (blocks[j] == together)
            for (int i = 0; i < outlen; i++) out[j][i] = (unsigned char)(hj[i / 8] >> (8 * (i % 8)));
        else
            blake2b_finish(hj, in[j] + 128 * together, n[j] - 128 * together, (uint64_t)(128 * together), out[j],
                           outlen);
    }
}
#endif

/* blake2b(in + starts[d], lengths[d]) into out + outlen * d for each of n messages; four at a time on a CPU with
 * AVX2 (blake2b_x4), those of as many blocks side by side (taken in order of their blocks, a counting sort). */
static void blake2b_many(const unsigned char *in, const Py_ssize_t *starts, const int64_t *lengths, Py_ssize_t n,
                         unsigned char *out, int outlen) {
    Py_ssize_t d = 0;
#ifdef HAVE_BLAKE2B_X4
    if (n >= 4 && __builtin_cpu_supports("avx2")) {
        enum { GROUPS = 64 };
        Py_ssize_t count[GROUPS + 1] = {0};
        Py_ssize_t *order = malloc((size_t)n * sizeof(Py_ssize_t));
        if (order) {
            for (Py_ssize_t i = 0; i < n; i++) {
                Py_ssize_t b = (lengths[i] + 127) / 128;
                count[(b < GROUPS ? b : GROUPS - 1) + 1]++;
            }
            for (int g = 0; g < GROUPS; g++) count[g + 1] += count[g];
            for (Py_ssize_t i = 0; i < n; i++) {
                Py_ssize_t b = (lengths[i] + 127) / 128;
                order[count[b < GROUPS ? b : GROUPS - 1]++] = i;
            }
            for (; d + 4 <= n; d += 4) {
                const unsigned char *ins[4];
                Py_ssize_t ns[4];
                unsigned char *outs[4];
                for (int j = 0; j < 4; j++) {
                    Py_ssize_t i = order[d + j];
                    ins[j] = in + starts[i];
                    ns[j] = lengths[i];
                    outs[j] = out + (Py_ssize_t)outlen * i;
                }
                blake2b_x4(ins, ns, outs, outlen);
            }
            for (; d < n; d++) blake2b(in + starts[order[d]], lengths[order[d]], out + (Py_ssize_t)outlen * order[d],
                                       outlen);
            free(order);
            return;
        }
    }
#endif
    for (; d < n; d++) blake2b(in + starts[d], lengths[d], out + (Py_ssize_t)outlen * d, outlen);
}

static PyObject *blake2b_digest(PyObject *self, PyObject *args) {
    Py_buffer data;
    int outlen;
    if (!PyArg_ParseTuple(args, "y*i", &data, &outlen)) return NULL;
    if (outlen < 1 || outlen > 64) {
        PyBuffer_Release(&data);
        return PyErr_Format(PyExc_ValueError, "digest_size must be 1 to 64");
    }
    unsigned char out[64];
    blake2b(data.buf, data.len, out, outlen);
    PyBuffer_Release(&data);
    return PyBytes_FromStringAndSize((const char *)out, outlen);
}

/* id_keys(ids): records.id_key of each str of a list, BLAKE2b-64 of its UTF-8 bytes, in one call. */
static PyObject *id_keys(PyObject *self, PyObject *args) {
    PyObject *ids;
    if (!PyArg_ParseTuple(args, "O!", &PyList_Type, &ids)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(ids);
    PyObject *result = PyList_New(n);
    for (Py_ssize_t i = 0; result && i < n; i++) {
        Py_ssize_t size;
        const char *text = PyUnicode_AsUTF8AndSize(PyList_GET_ITEM(ids, i), &size); /* TypeError if not a str */
        PyObject *key = text ? PyBytes_FromStringAndSize(NULL, 8) : NULL;
        if (!key) { Py_CLEAR(result); break; }
        blake2b((const unsigned char *)text, size, (unsigned char *)PyBytes_AS_STRING(key), 8);
        PyList_SET_ITEM(result, i, key);
    }
    return result;
}

/* prepare_ascii(text, text_lengths, kind_word, k, a, b, bands, rows, band_base,
 *               out_points, out_lengths, out_contents, out_shingles, out_offsets, out_keys) -> shingles written
 *
 * What core.prepare makes of a batch of ASCII texts, in one pass per document: ascii_normalize's
 * normalized bytes (out_points, documents separated by 0, out_lengths), each document's content hash
 * (BLAKE2b-128 of its normalized bytes, 16 bytes each into out_contents), its shingle hashes as
 * shingles computes them (an ASCII byte is its code point), narrowed to their top 32 bits, sorted and
 * unique (shingle.narrow: out_shingles, out_offsets), signed (minhash) and cut into band keys
 * (lsh.band_keys: out_keys, documents x bands uint64 holding 32 bits). A document left empty gets no
 * shingles, and keys of a signature of all 0xFFFFFFFF: the caller rejects it. */
static PyObject *prepare_ascii(PyObject *self, PyObject *args) {
    PyObject *o[15];
    int kind_word;
    Py_ssize_t k, bands, rows;
    unsigned long long band_base;
    if (!PyArg_ParseTuple(args, "OOpnOOnnKOOOOOO", &o[0], &o[1], &kind_word, &k, &o[2], &o[3], &bands, &rows,
                          &band_base, &o[4], &o[5], &o[6], &o[7], &o[8], &o[9]))
        return NULL;
    static const char *names[10] = {"text", "text_lengths", "a", "b", "out_points", "out_lengths", "out_contents",
                                    "out_shingles", "out_offsets", "out_keys"};
    static const Py_ssize_t sizes[10] = {1, 8, 4, 4, 1, 8, 1, 4, 8, 8};
    Py_buffer v[10];
    int got = 0;
    Py_ssize_t written = -1;
    for (; got < 10; got++)
        if (get_buffer(o[got], &v[got], sizes[got], got >= 4, names[got]) < 0) goto done;
    Py_ssize_t n_docs = v[1].len / 8, num_perm = v[2].len / 4, total = 0;
    const int64_t *ln = v[1].buf;
    for (Py_ssize_t d = 0; d < n_docs; d++) {
        if (ln[d] < 0) { total = -1; break; }
        total += ln[d];
    }
    if (k < 1 || bands < 1 || rows < 1 || bands * rows > num_perm || v[3].len != v[2].len || total != v[0].len
        || v[4].len < v[0].len + n_docs || v[5].len / 8 != n_docs || v[6].len != 16 * n_docs
        || v[7].len / 4 < v[0].len + n_docs || v[8].len / 8 != n_docs + 1 || v[9].len / 8 != n_docs * bands) {
        PyErr_SetString(PyExc_ValueError, "prepare_ascii: the inputs and outputs disagree on their sizes");
        goto done;
    }
    /* normalize the whole batch first (ascii_normalize's), then each document's hashes */
    unsigned char *pts = v[4].buf, *contents = v[6].buf;
    int64_t *out_lengths = v[5].buf, *off = v[8].buf;
    uint32_t *out_sh = v[7].buf;
    uint64_t *keys = v[9].buf;
    const uint32_t *pa = v[2].buf, *pb = v[3].buf;
    Py_ssize_t longest = 0;
    normalize_ascii_batch(v[0].buf, ln, n_docs, pts, out_lengths);
    for (Py_ssize_t d = 0; d < n_docs; d++)
        if (out_lengths[d] > longest) longest = out_lengths[d];
    uint64_t *scratch = malloc((size_t)(longest + 1) * 5 * sizeof(uint64_t));
    Py_ssize_t *units = malloc((size_t)(longest + 1) * 2 * sizeof(Py_ssize_t));
    uint32_t *bucket_end = malloc(((1 << MAX_BUCKET_BITS) + 1) * sizeof(uint32_t));
    uint32_t *code = malloc((size_t)(longest + 1) * sizeof(uint32_t));
    uint32_t *signature = malloc((size_t)(num_perm ? num_perm : 1) * sizeof(uint32_t));
    uint64_t *band_powers = malloc((size_t)rows * sizeof(uint64_t));
    Py_ssize_t *starts = malloc((size_t)(n_docs ? n_docs : 1) * sizeof(Py_ssize_t));
    if (!scratch || !units || !bucket_end || !code || !signature || !band_powers || !starts) {
        free(scratch); free(units); free(bucket_end); free(code); free(signature); free(band_powers); free(starts);
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t out_at = 0;
    Py_BEGIN_ALLOW_THREADS
    uint64_t *powers = scratch, *inverse = scratch + (longest + 1), *prefix = scratch + 2 * (longest + 1);
    uint64_t *hashes = scratch + 3 * (longest + 1), *sort_space = scratch + 4 * (longest + 1);
    powers[0] = inverse[0] = 1;
    for (Py_ssize_t i = 1; i <= longest; i++) {
        powers[i] = powers[i - 1] * POLY_BASE;
        inverse[i] = inverse[i - 1] * POLY_BASE_INVERSE;
    }
    band_powers[0] = band_base;
    for (Py_ssize_t r = 1; r < rows; r++) band_powers[r] = band_powers[r - 1] * band_base;
    Py_ssize_t at = 0;
    for (Py_ssize_t d = 0; d < n_docs; d++) { /* each document's place in pts, then their content hashes */
        starts[d] = at;
        at += out_lengths[d] + 1;
    }
    blake2b_many(pts, starts, out_lengths, n_docs, contents, 16);
    at = 0;
    off[0] = 0;
    for (Py_ssize_t d = 0; d < n_docs; d++) {
        Py_ssize_t length = out_lengths[d];
        const unsigned char *doc = pts + at;
        Py_ssize_t grams = 0;
        if (length && kind_word) {
            grams = ascii_word_shingles(doc, length, k, powers, inverse, units, prefix, hashes);
        } else if (length) {
            for (Py_ssize_t i = 0; i < length; i++) code[i] = doc[i];
            grams = document_shingles(code, length, kind_word, k, powers, inverse, prefix, units, units + longest + 1,
                                      hashes);
        }
        grams = sort_unique(hashes, sort_space, bucket_end, grams);
        uint32_t *narrowed = out_sh + out_at;
        Py_ssize_t kept = 0;
        uint32_t last = 0;  /* the last value kept, in a register (read back from memory, each step waited) */
        for (Py_ssize_t g = 0; g < grams; g++) { /* sorted by the whole hash: the top 32 bits are sorted too */
            uint32_t high = (uint32_t)(hashes[g] >> 32);
            narrowed[kept] = high;
            kept += kept == 0 || last != high;
            last = high;
        }
        out_at += kept;
        off[d + 1] = out_at;
        minhash_document(narrowed, 0, kept, pa, pb, num_perm, signature);
        for (Py_ssize_t band = 0; band < bands; band++) {
            uint64_t folded = 0;
            for (Py_ssize_t r = 0; r < rows; r++) folded += (uint64_t)signature[band * rows + r] * band_powers[r];
            folded ^= (uint64_t)(band + 1) * GOLDEN;
            keys[d * bands + band] = fmix64(folded) >> 32;
        }
        at += length + 1;
    }
    Py_END_ALLOW_THREADS
    written = out_at;
    free(scratch); free(units); free(bucket_end); free(code); free(signature); free(band_powers); free(starts);
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&v[i]);
    if (written < 0) return NULL;
    return PyLong_FromSsize_t(written);
}

/* hits(asked, rows, n, found_keys, found_serials) -> (serials, shared, bounds, most)
 *
 * candidates.Hits.found's pairs: every found (key, serial) entry meets each place of its key among
 * the batch's sorted keys ``asked`` (the row of place p is rows[p]); each (row, serial) met, its
 * serials ascending within each row and how many places met it (int64, as bytearrays), the
 * (n + 1) bounds of each row's pairs, and the most found entries of any one asked key. */
static int compare_i64(const void *x, const void *y) {
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}


static PyObject *hits(PyObject *self, PyObject *args) {
    PyObject *o[4];
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "OOnOO", &o[0], &o[1], &n, &o[2], &o[3])) return NULL;
    static const char *names[4] = {"asked", "rows", "found_keys", "found_serials"};
    Py_buffer v[4];
    int got = 0;
    PyObject *result = NULL;
    int64_t *met = NULL, *per_row = NULL, *start = NULL, *sorted_serials = NULL;
    Py_ssize_t *key_count = NULL;
    for (; got < 4; got++)
        if (get_buffer(o[got], &v[got], 8, 0, names[got]) < 0) goto done;
    Py_ssize_t a = v[0].len / 8, f = v[2].len / 8;
    const uint64_t *asked = v[0].buf, *keys = v[2].buf;
    const int64_t *rows = v[1].buf, *serials = v[3].buf;
    if (v[1].len / 8 != a || v[3].len / 8 != f || n < 0) {
        PyErr_SetString(PyExc_ValueError, "hits: asked and rows, or found keys and serials, differ in length");
        goto done;
    }
    for (Py_ssize_t p = 0; p < a; p++)
        if (rows[p] < 0 || rows[p] >= n) { PyErr_SetString(PyExc_ValueError, "hits: a row out of range"); goto done; }
    /* each found entry's places: [lo, hi) of its key in asked */
    Py_ssize_t total = 0, most = 0;
    met = malloc((size_t)(2 * f + 1) * sizeof(int64_t));
    key_count = calloc((size_t)a + 1, sizeof(Py_ssize_t));
    per_row = calloc((size_t)n + 1, sizeof(int64_t));
    start = malloc((size_t)(n + 1) * sizeof(int64_t));
    if (!met || !key_count || !per_row || !start) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < f; i++) {
        /* found keys come sorted (most batches): each search starts where the one before ended */
        Py_ssize_t lo = lower_bound_from(asked, a, keys[i], i > 0 && keys[i] >= keys[i - 1] ? met[2 * i - 2] : 0);
        Py_ssize_t end = lo;
        while (end < a && asked[end] == keys[i]) end++;
        met[2 * i] = lo;
        met[2 * i + 1] = end;
        if (end > lo) {
            Py_ssize_t c = ++key_count[lo];
            if (c > most) most = c;
            for (Py_ssize_t p = lo; p < end; p++) per_row[rows[p]]++;
            total += end - lo;
        }
    }
    /* the serials met, bucketed by row (a counting sort), then sorted within each row */
    sorted_serials = malloc((size_t)(total ? total : 1) * sizeof(int64_t));
    if (!sorted_serials) { PyErr_NoMemory(); goto done; }
    int64_t at = 0;
    for (Py_ssize_t r = 0; r < n; r++) { start[r] = at; at += per_row[r]; }
    start[n] = at;
    for (Py_ssize_t r = 0; r < n; r++) per_row[r] = start[r]; /* next free place of each row */
    for (Py_ssize_t i = 0; i < f; i++)
        for (Py_ssize_t p = met[2 * i]; p < met[2 * i + 1]; p++) sorted_serials[per_row[rows[p]]++] = serials[i];
    Py_ssize_t unique = 0;
    for (Py_ssize_t r = 0; r < n; r++) {
        Py_ssize_t size = start[r + 1] - start[r];
        int64_t *s = sorted_serials + start[r];
        if (size > 16) qsort(s, (size_t)size, sizeof(int64_t), compare_i64);
        else for (Py_ssize_t i = 1; i < size; i++) {
            int64_t x = s[i];
            Py_ssize_t j = i;
            while (j > 0 && s[j - 1] > x) { s[j] = s[j - 1]; j--; }
            s[j] = x;
        }
        for (Py_ssize_t i = 0; i < size; i++) unique += i == 0 || s[i] != s[i - 1];
    }
    PyObject *o_serials = PyByteArray_FromStringAndSize(NULL, unique * 8);
    PyObject *o_shared = PyByteArray_FromStringAndSize(NULL, unique * 8);
    PyObject *o_bounds = PyByteArray_FromStringAndSize(NULL, (n + 1) * 8);
    if (!o_serials || !o_shared || !o_bounds) {
        Py_XDECREF(o_serials); Py_XDECREF(o_shared); Py_XDECREF(o_bounds);
        goto done;
    }
    int64_t *out_serials = (int64_t *)PyByteArray_AS_STRING(o_serials);
    int64_t *out_shared = (int64_t *)PyByteArray_AS_STRING(o_shared), *bounds = (int64_t *)PyByteArray_AS_STRING(o_bounds);
    Py_ssize_t w = 0;
    for (Py_ssize_t r = 0; r < n; r++) {
        bounds[r] = w;
        for (int64_t i = start[r]; i < start[r + 1]; i++) {
            if (i > start[r] && sorted_serials[i] == sorted_serials[i - 1]) { out_shared[w - 1]++; continue; }
            out_serials[w] = sorted_serials[i];
            out_shared[w++] = 1;
        }
    }
    bounds[n] = w;
    result = Py_BuildValue("NNNn", o_serials, o_shared, o_bounds, most);
done:
    free(met); free(key_count); free(per_row); free(start); free(sorted_serials);
    for (int i = 0; i < got; i++) PyBuffer_Release(&v[i]);
    return result;
}

/* The recent mirror's presence map: one bit per (key >> shift), the map's size a power of two. */
static int key_bits_args(PyObject *args, Py_buffer *bits, Py_buffer *keys, int *shift, PyObject **out) {
    PyObject *o_bits, *o_keys;
    *out = NULL;
    if (!PyArg_ParseTuple(args, "OOi|O", &o_bits, &o_keys, shift, out)) return -1;
    if (*shift < 0 || *shift > 63) { PyErr_SetString(PyExc_ValueError, "key bits: shift out of range"); return -1; }
    if (get_buffer(o_bits, bits, 1, 1, "bits") < 0) return -1;
    if (bits->len == 0 || (bits->len & (bits->len - 1))) {
        PyErr_SetString(PyExc_ValueError, "key bits: the map's size must be a power of two");
        PyBuffer_Release(bits);
        return -1;
    }
    if (get_buffer(o_keys, keys, 8, 0, "keys") < 0) { PyBuffer_Release(bits); return -1; }
    return 0;
}

static PyObject *key_bits_set(PyObject *self, PyObject *args) {
    Py_buffer bits, keys;
    int shift;
    PyObject *unused;
    if (key_bits_args(args, &bits, &keys, &shift, &unused) < 0) return NULL;
    uint8_t *map = bits.buf;
    const uint64_t *k = keys.buf, mask = (uint64_t)bits.len * 8 - 1;
    Py_ssize_t n = keys.len / 8;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t number = (k[i] >> shift) & mask;
        map[number >> 3] |= (uint8_t)(1u << (number & 7));
    }
    PyBuffer_Release(&keys);
    PyBuffer_Release(&bits);
    Py_RETURN_NONE;
}

static PyObject *key_bits_test(PyObject *self, PyObject *args) {
    Py_buffer bits, keys, out;
    int shift;
    PyObject *o_out;
    if (key_bits_args(args, &bits, &keys, &shift, &o_out) < 0) return NULL;
    if (o_out == NULL || get_buffer(o_out, &out, 1, 1, "out") < 0) {
        if (o_out == NULL) PyErr_SetString(PyExc_TypeError, "key_bits_test: out is required");
        PyBuffer_Release(&keys); PyBuffer_Release(&bits);
        return NULL;
    }
    Py_ssize_t n = keys.len / 8;
    if (out.len != n) {
        PyErr_SetString(PyExc_ValueError, "key_bits_test: out must have one byte a key");
    } else {
        const uint8_t *map = bits.buf;
        const uint64_t *k = keys.buf, mask = (uint64_t)bits.len * 8 - 1;
        uint8_t *o = out.buf;
        for (Py_ssize_t i = 0; i < n; i++) {
            uint64_t number = (k[i] >> shift) & mask;
            o[i] = (map[number >> 3] >> (number & 7)) & 1;
        }
    }
    PyBuffer_Release(&out); PyBuffer_Release(&keys); PyBuffer_Release(&bits);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* Entries (uint64 key, 8-byte value) sorted by key in place, stably: a least significant digit first radix
 * sort of 11-bit digits over the bits the keys differ in. */
static PyObject *sort_entries(PyObject *self, PyObject *args) {
    PyObject *o_keys, *o_values;
    if (!PyArg_ParseTuple(args, "OO", &o_keys, &o_values)) return NULL;
    Py_buffer kv, vv;
    if (get_buffer(o_keys, &kv, 8, 1, "keys") < 0) return NULL;
    if (get_buffer(o_values, &vv, 8, 1, "values") < 0) { PyBuffer_Release(&kv); return NULL; }
    Py_ssize_t n = kv.len / 8;
    uint64_t *tmp = NULL;
    if (vv.len != kv.len) {
        PyErr_SetString(PyExc_ValueError, "sort_entries: keys and values differ in length");
        goto done;
    }
    if (n < 2) goto done;
    uint64_t *keys = kv.buf, *values = vv.buf, differ = 0;
    for (Py_ssize_t i = 1; i < n; i++) differ |= keys[i] ^ keys[0];
    if (!differ) goto done;
    tmp = malloc((size_t)n * 16);
    if (!tmp) { PyErr_NoMemory(); goto done; }
    uint64_t *tkeys = tmp, *tvalues = tmp + n, *src_k = keys, *src_v = values, *dst_k = tkeys, *dst_v = tvalues;
    Py_ssize_t (*count)[257] = calloc(8, sizeof(*count));
    if (!count) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < n; i++)
        for (int d = 0; d < 8; d++) count[d][((src_k[i] >> (8 * d)) & 255) + 1]++;
    for (int d = 0; d < 8; d++) {
        int shift = 8 * d;
        if (!((differ >> shift) & 255)) continue; /* every key has the same byte here */
        Py_ssize_t *at = count[d];
        for (int c = 0; c < 256; c++) at[c + 1] += at[c];
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_ssize_t to = at[(src_k[i] >> shift) & 255]++;
            dst_k[to] = src_k[i];
            dst_v[to] = src_v[i];
        }
        uint64_t *t = src_k; src_k = dst_k; dst_k = t;
        t = src_v; src_v = dst_v; dst_v = t;
    }
    free(count);
    if (src_k != keys) {
        memcpy(keys, src_k, (size_t)n * 8);
        memcpy(values, src_v, (size_t)n * 8);
    }
done:
    free(tmp);
    PyBuffer_Release(&vv);
    PyBuffer_Release(&kv);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* One band's entries (key << 32 | row) sorted by key, rows ascending among equal keys: an LSD radix
 * sort of the key's four bytes (a byte every entry shares is skipped); the result in v or tmp, returned. */
static uint64_t *sort_band(uint64_t *v, uint64_t *tmp, Py_ssize_t n) {
    Py_ssize_t count[4][257];
    memset(count, 0, sizeof(count));
    for (Py_ssize_t i = 0; i < n; i++)
        for (int d = 0; d < 4; d++) count[d][((v[i] >> (32 + 8 * d)) & 255) + 1]++;
    for (int d = 0; d < 4; d++) {
        int shift = 32 + 8 * d;
        if (count[d][((v[0] >> shift) & 255) + 1] == n) continue;
        for (int c = 0; c < 256; c++) count[d][c + 1] += count[d][c];
        for (Py_ssize_t i = 0; i < n; i++) tmp[count[d][(v[i] >> shift) & 255]++] = v[i];
        uint64_t *t = v; v = tmp; tmp = t;
    }
    return v;
}

/* Whether keys (rows x bands of them) can be sorted by band_slots_sorted. */
static int band_slots_fit(const uint64_t *keys, Py_ssize_t rows, Py_ssize_t bands) {
    uint64_t high = 0;
    for (Py_ssize_t i = 0; i < rows * bands; i++) high |= keys[i] >> 32;
    return high == 0 && rows > 0 && rows < ((Py_ssize_t)1 << 31) && bands <= 65536;
}

static PyObject *band_slots_sorted(PyObject *self, PyObject *args) {
    PyObject *o[4];
    Py_ssize_t bands;
    if (!PyArg_ParseTuple(args, "OnOOO", &o[0], &bands, &o[1], &o[2], &o[3])) return NULL;
    static const char *names[4] = {"keys", "out_slots", "out_rows", "out_bands"};
    static const Py_ssize_t sizes[4] = {8, 8, 8, 2};
    Py_buffer v[4];
    int got = 0, sorted_here = 0;
    uint64_t *buffer = NULL;
    for (; got < 4; got++)
        if (get_buffer(o[got], &v[got], sizes[got], got > 0, names[got]) < 0) goto done;
    Py_ssize_t total = v[0].len / 8;
    if (bands < 1 || total % bands || v[1].len != total * 8 || v[2].len != total * 8 || v[3].len != total * 2) {
        PyErr_SetString(PyExc_ValueError, "band_slots_sorted: the keys and outputs disagree on their sizes");
        goto done;
    }
    Py_ssize_t n = total / bands;
    const uint64_t *keys = v[0].buf;
    if (!band_slots_fit(keys, n, bands)) goto done;
    buffer = malloc((size_t)n * 2 * sizeof(uint64_t));
    if (!buffer) { PyErr_NoMemory(); goto done; }
    uint64_t *slots = v[1].buf;
    int64_t *rows = v[2].buf;
    uint16_t *out_bands = v[3].buf;
    for (Py_ssize_t band = 0; band < bands; band++) {
        for (Py_ssize_t row = 0; row < n; row++) buffer[row] = keys[row * bands + band] << 32 | (uint64_t)row;
        const uint64_t *sorted = sort_band(buffer, buffer + n, n);
        for (Py_ssize_t i = 0, at = band * n; i < n; i++, at++) {
            slots[at] = (uint64_t)band << 32 | sorted[i] >> 32;
            rows[at] = (int64_t)(sorted[i] & 0xFFFFFFFFu);
            out_bands[at] = (uint16_t)band;
        }
    }
    sorted_here = 1;
done:
    free(buffer);
    for (int i = 0; i < got; i++) PyBuffer_Release(&v[i]);
    if (PyErr_Occurred()) return NULL;
    return PyBool_FromLong(sorted_here);
}

static PyObject *kept_entries(PyObject *self, PyObject *args) {
    PyObject *o[5];
    if (!PyArg_ParseTuple(args, "OOOOO", &o[0], &o[1], &o[2], &o[3], &o[4])) return NULL;
    static const char *names[5] = {"slots", "rows", "serial_of", "out_slots", "out_serials"};
    Py_buffer v[5];
    int got = 0;
    Py_ssize_t written = -1;
    for (; got < 5; got++)
        if (get_buffer(o[got], &v[got], 8, got > 2, names[got]) < 0) goto done;
    Py_ssize_t n = v[0].len / 8, rows = v[2].len / 8;
    if (v[1].len != v[0].len || v[3].len < v[0].len || v[4].len < v[0].len) {
        PyErr_SetString(PyExc_ValueError, "kept_entries: the slots, rows and outputs disagree on their sizes");
        goto done;
    }
    const uint64_t *slots = v[0].buf;
    const int64_t *row_of = v[1].buf, *serial_of = v[2].buf;
    uint64_t *out_slots = v[3].buf;
    int64_t *out_serials = v[4].buf;
    Py_ssize_t w = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t row = row_of[i];
        if (row < 0 || row >= rows) {
            PyErr_SetString(PyExc_ValueError, "kept_entries: a slot's row is out of range");
            goto done;
        }
        int64_t serial = serial_of[row];
        if (serial != -1) {
            out_slots[w] = slots[i];
            out_serials[w++] = serial;
        }
    }
    written = w;
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&v[i]);
    if (written < 0) return NULL;
    return PyLong_FromSsize_t(written);
}

/* msgpack, as msgpack.Packer() packs (fallback.Packer._pack), for the types an index record holds. */
typedef struct { unsigned char *data; Py_ssize_t size, room; } Out;

static int out_reserve(Out *out, Py_ssize_t more) {
    if (out->size + more <= out->room) return 0;
    Py_ssize_t room = out->room ? out->room : 256;
    while (room < out->size + more) room *= 2;
    unsigned char *grown = realloc(out->data, (size_t)room);
    if (!grown) { PyErr_NoMemory(); return -1; }
    out->data = grown;
    out->room = room;
    return 0;
}

static int out_head(Out *out, unsigned char head, uint64_t value, int width) {
    if (out_reserve(out, 1 + width) < 0) return -1;
    out->data[out->size++] = head;
    for (int i = width - 1; i >= 0; i--) out->data[out->size++] = (unsigned char)(value >> (8 * i));
    return 0;
}

static int out_bytes(Out *out, const char *data, Py_ssize_t n) {
    if (out_reserve(out, n) < 0) return -1;
    memcpy(out->data + out->size, data, (size_t)n);
    out->size += n;
    return 0;
}

/* 0: packed; -1: an error set; 1: a type left to msgpack (nothing written that counts: the caller drops it) */
static int pack_object(Out *out, PyObject *o, int depth) {
    if (o == Py_None) return out_head(out, 0xc0, 0, 0);
    if (o == Py_True) return out_head(out, 0xc3, 0, 0);
    if (o == Py_False) return out_head(out, 0xc2, 0, 0);
    if (PyLong_CheckExact(o)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (v == -1 && PyErr_Occurred()) return -1;
        if (overflow > 0) {
            unsigned long long u = PyLong_AsUnsignedLongLong(o);
            if (u == (unsigned long long)-1 && PyErr_Occurred()) { PyErr_Clear(); return 1; } /* msgpack raises */
            return out_head(out, 0xcf, u, 8);
        }
        if (overflow < 0) return 1;
        if (v >= 0) {
            if (v < 0x80) return out_head(out, (unsigned char)v, 0, 0);
            if (v <= 0xff) return out_head(out, 0xcc, (uint64_t)v, 1);
            if (v <= 0xffff) return out_head(out, 0xcd, (uint64_t)v, 2);
            if (v <= 0xffffffffLL) return out_head(out, 0xce, (uint64_t)v, 4);
            return out_head(out, 0xcf, (uint64_t)v, 8);
        }
        if (v >= -0x20) return out_head(out, (unsigned char)(v & 0xff), 0, 0);
        if (v >= -0x80) return out_head(out, 0xd0, (uint64_t)v & 0xff, 1);
        if (v >= -0x8000) return out_head(out, 0xd1, (uint64_t)v & 0xffff, 2);
        if (v >= -0x80000000LL) return out_head(out, 0xd2, (uint64_t)v & 0xffffffffULL, 4);
        return out_head(out, 0xd3, (uint64_t)v, 8);
    }
    if (PyFloat_CheckExact(o)) {
        double d = PyFloat_AS_DOUBLE(o);
        uint64_t bits;
        memcpy(&bits, &d, 8);
        return out_head(out, 0xcb, bits, 8);
    }
    if (PyBytes_CheckExact(o)) {
        Py_ssize_t n = PyBytes_GET_SIZE(o);
        if (n >= ((Py_ssize_t)1 << 32)) return 1;
        int r = n <= 0xff ? out_head(out, 0xc4, (uint64_t)n, 1)
              : n <= 0xffff ? out_head(out, 0xc5, (uint64_t)n, 2) : out_head(out, 0xc6, (uint64_t)n, 4);
        return r < 0 ? -1 : out_bytes(out, PyBytes_AS_STRING(o), n);
    }
    if (PyUnicode_CheckExact(o)) {
        Py_ssize_t n;
        const char *utf8 = PyUnicode_AsUTF8AndSize(o, &n);
        if (!utf8) { PyErr_Clear(); return 1; } /* surrogates: msgpack says what is wrong */
        if (n >= ((Py_ssize_t)1 << 32)) return 1;
        int r = n <= 0x1f ? out_head(out, (unsigned char)(0xa0 + n), 0, 0)
              : n <= 0xff ? out_head(out, 0xd9, (uint64_t)n, 1)
              : n <= 0xffff ? out_head(out, 0xda, (uint64_t)n, 2) : out_head(out, 0xdb, (uint64_t)n, 4);
        return r < 0 ? -1 : out_bytes(out, utf8, n);
    }
    if (PyList_CheckExact(o) && depth < 8) {
        Py_ssize_t n = PyList_GET_SIZE(o);
        int r = n <= 0x0f ? out_head(out, (unsigned char)(0x90 + n), 0, 0)
              : n <= 0xffff ? out_head(out, 0xdc, (uint64_t)n, 2) : out_head(out, 0xdd, (uint64_t)n, 4);
        for (Py_ssize_t i = 0; r == 0 && i < n; i++) r = pack_object(out, PyList_GET_ITEM(o, i), depth + 1);
        return r;
    }
    return 1;
}

enum { R_SERIAL, R_ID, R_KEPT, R_CLUSTER, R_CLUSTER_ID, R_MATCHED, R_MATCHED_ID, R_SIMILARITY, R_EXACT, R_CONTENT,
       R_SOURCE, R_BAND_KEYS, R_TIME, R_EXPIRED, R_SITE, R_CONTAINMENT, R_FIELDS };
static const char *record_fields[R_FIELDS] = {"serial", "id", "kept", "cluster", "cluster_id", "matched", "matched_id",
    "similarity", "exact", "content", "source", "band_keys", "time", "expired", "site", "containment"};
static PyObject *record_names[R_FIELDS];

static int equal(PyObject *a, PyObject *b) { return PyObject_RichCompareBool(a, b, Py_EQ); }

/* One record as DocRecord.pack(number) packs it: 0 packed, 1 left to msgpack, -1 an error. */
static int pack_record_into(Out *out, PyObject *record, PyObject *number) {
    PyObject *f[R_FIELDS] = {NULL}, *source = NULL, *zero = NULL;
    int result = -1;
    for (int i = 0; i < R_FIELDS; i++)
        if (!(f[i] = PyObject_GetAttr(record, record_names[i]))) goto done;
    /* values said twice are stored once (DocRecord.pack) */
    PyObject *stored[15];
    int e;
    stored[0] = f[R_ID];
    stored[1] = f[R_KEPT];
    if ((e = equal(f[R_CLUSTER], f[R_SERIAL])) < 0) goto done;
    stored[2] = e ? Py_None : f[R_CLUSTER];
    if ((e = equal(f[R_CLUSTER_ID], f[R_ID])) < 0) goto done;
    stored[3] = e ? Py_None : f[R_CLUSTER_ID];
    PyObject *minus_one = NULL;
    if (f[R_MATCHED] != Py_None) {
        if ((e = equal(f[R_MATCHED], f[R_CLUSTER])) < 0) goto done;
        if (e) {
            if (!(minus_one = PyLong_FromLong(-1))) goto done;
        }
    }
    stored[4] = minus_one ? minus_one : f[R_MATCHED];
    if ((e = equal(f[R_MATCHED_ID], f[R_CLUSTER_ID])) < 0) { Py_XDECREF(minus_one); goto done; }
    stored[5] = e ? Py_None : f[R_MATCHED_ID];
    stored[6] = f[R_SIMILARITY];
    stored[7] = f[R_EXACT];
    stored[8] = f[R_CONTENT];
    stored[10] = f[R_BAND_KEYS];
    stored[11] = f[R_TIME];
    stored[12] = f[R_EXPIRED];
    stored[13] = f[R_SITE];
    stored[14] = f[R_CONTAINMENT];
    if (!PyList_CheckExact(f[R_SOURCE]) || PyList_GET_SIZE(f[R_SOURCE]) < 1) { Py_XDECREF(minus_one); result = 1; goto done; }
    source = PyList_GetSlice(f[R_SOURCE], 0, PyList_GET_SIZE(f[R_SOURCE]));
    if (!source) { Py_XDECREF(minus_one); goto done; }
    Py_INCREF(number);
    PyList_SetItem(source, 0, number);
    stored[9] = source;
    /* the last fields left out while they hold their defaults (False, 0, None) */
    int n = 15;
    if (!(zero = PyLong_FromLong(0))) { Py_XDECREF(minus_one); goto done; }
    PyObject *defaults[3] = {Py_False, zero, Py_None};
    while (n > 12) {
        if ((e = equal(stored[n - 1], defaults[n - 13])) < 0) { Py_XDECREF(minus_one); goto done; }
        if (!e) break;
        n--;
    }
    Py_ssize_t began = out->size;
    result = out_head(out, (unsigned char)(0x90 + n), 0, 0);
    for (int i = 0; result == 0 && i < n; i++) result = pack_object(out, stored[i], 0);
    if (result != 0) out->size = began;
    Py_XDECREF(minus_one);
done:
    for (int i = 0; i < R_FIELDS; i++) Py_XDECREF(f[i]);
    Py_XDECREF(source);
    Py_XDECREF(zero);
    return result;
}

static PyObject *pack_records(PyObject *self, PyObject *args) {
    PyObject *records, *numbers;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &records, &PyList_Type, &numbers)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(records);
    if (PyList_GET_SIZE(numbers) != n) {
        PyErr_SetString(PyExc_ValueError, "pack_records: one source number a record");
        return NULL;
    }
    for (int i = 0; i < R_FIELDS; i++)
        if (!record_names[i] && !(record_names[i] = PyUnicode_InternFromString(record_fields[i]))) return NULL;
    PyObject *packed = PyList_New(n);
    if (!packed) return NULL;
    Out out = {NULL, 0, 0};
    for (Py_ssize_t i = 0; i < n; i++) {
        out.size = 0;
        int r = pack_record_into(&out, PyList_GET_ITEM(records, i), PyList_GET_ITEM(numbers, i));
        if (r < 0) { Py_DECREF(packed); free(out.data); return NULL; }
        PyObject *value = r ? (Py_INCREF(Py_None), Py_None)
                            : PyBytes_FromStringAndSize((const char *)out.data, out.size);
        if (!value) { Py_DECREF(packed); free(out.data); return NULL; }
        PyList_SET_ITEM(packed, i, value);
    }
    free(out.data);
    return packed;
}

/* Positions of the entries of sorted keys whose key is among sorted unique asked ones, ascending: a search
 * per asked key from where the one before ended, by doubling steps (lower_bound_from), not over all the rest:
 * asked keys are a few thousand spread over a mirror of up to millions of entries, and the next one's place is
 * mostly a few cache lines ahead. */
static PyObject *sorted_matches(PyObject *self, PyObject *args) {
    PyObject *o_keys, *o_asked;
    if (!PyArg_ParseTuple(args, "OO", &o_keys, &o_asked)) return NULL;
    Py_buffer kv, av;
    if (get_buffer(o_keys, &kv, 8, 0, "keys") < 0) return NULL;
    if (get_buffer(o_asked, &av, 8, 0, "asked") < 0) { PyBuffer_Release(&kv); return NULL; }
    const uint64_t *keys = kv.buf, *asked = av.buf;
    Py_ssize_t n = kv.len / 8, a = av.len / 8, room = a > 16 ? a : 16, found = 0, from = 0;
    int64_t *at = malloc((size_t)room * sizeof(int64_t));
    PyObject *result = NULL;
    if (!at) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t q = 0; q < a && from < n; q++) {
        uint64_t want = asked[q];
        if (keys[n - 1] < want) break;
        from = lower_bound_from(keys, n, want, from);
        while (from < n && keys[from] == want) {
            if (found == room) {
                room *= 2;
                int64_t *grown = realloc(at, (size_t)room * sizeof(int64_t));
                if (!grown) { PyErr_NoMemory(); goto done; }
                at = grown;
            }
            at[found++] = from++;
        }
    }
    result = PyByteArray_FromStringAndSize((const char *)at, found * 8);
done:
    free(at);
    PyBuffer_Release(&av);
    PyBuffer_Release(&kv);
    return result;
}

/* The band filter (store/bandfilter.py): a key's word in a layer of w words (a power of two) is
 * (key * BLOOM_SPREAD) & (w - 1), its mask the bits at four 6-bit fields of the product's top 24 bits. */
#define BLOOM_SPREAD 0x9E3779B97F4A7C15ULL
#define BLOOM_LAYERS 64
#define BLOOM_AHEAD 16 /* keys whose words are fetched while one is tested */

static inline uint64_t bloom_mask(uint64_t spread) {
    return (1ULL << ((spread >> 58) & 63)) | (1ULL << ((spread >> 52) & 63)) | (1ULL << ((spread >> 46) & 63))
           | (1ULL << ((spread >> 40) & 63));
}

static int bloom_layers(PyObject *o_layers, Py_buffer *views, int writable) {
    if (!PyTuple_Check(o_layers) || PyTuple_GET_SIZE(o_layers) > BLOOM_LAYERS) {
        PyErr_SetString(PyExc_TypeError, "layers: a tuple of at most 64 uint64 arrays");
        return -1;
    }
    int n = (int)PyTuple_GET_SIZE(o_layers);
    for (int i = 0; i < n; i++) {
        if (get_buffer(PyTuple_GET_ITEM(o_layers, i), &views[i], 8, writable, "layer") < 0) {
            while (i--) PyBuffer_Release(&views[i]);
            return -1;
        }
        Py_ssize_t words = views[i].len / 8;
        if (words <= 0 || (words & (words - 1))) {
            PyErr_SetString(PyExc_ValueError, "layer: a power of two words");
            for (; i >= 0; i--) PyBuffer_Release(&views[i]);
            return -1;
        }
    }
    return n;
}

/* out[i] = 1 if any layer may hold keys[i] (uint64), else 0; the words of later keys fetched ahead. */
static PyObject *bloom_may_hold(PyObject *self, PyObject *args) {
    PyObject *o_keys, *o_layers, *o_out;
    if (!PyArg_ParseTuple(args, "OOO", &o_keys, &o_layers, &o_out)) return NULL;
    Py_buffer keys, out, views[BLOOM_LAYERS];
    if (get_buffer(o_keys, &keys, 8, 0, "keys") < 0) return NULL;
    if (get_buffer(o_out, &out, 1, 1, "out") < 0) { PyBuffer_Release(&keys); return NULL; }
    int layers = bloom_layers(o_layers, views, 0);
    if (layers < 0) { PyBuffer_Release(&out); PyBuffer_Release(&keys); return NULL; }
    Py_ssize_t n = keys.len / 8;
    if (out.len != n) {
        PyErr_SetString(PyExc_ValueError, "out: one byte a key");
    } else {
        const uint64_t *k = keys.buf;
        uint8_t *o = out.buf;
        const uint64_t *bits[BLOOM_LAYERS];
        uint64_t last[BLOOM_LAYERS];
        for (int l = 0; l < layers; l++) { bits[l] = views[l].buf; last[l] = (uint64_t)(views[l].len / 8) - 1; }
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            if (i + BLOOM_AHEAD < n) {
                uint64_t ahead = k[i + BLOOM_AHEAD] * BLOOM_SPREAD;
                for (int l = 0; l < layers; l++) __builtin_prefetch(&bits[l][ahead & last[l]]);
            }
            uint64_t spread = k[i] * BLOOM_SPREAD, mask = bloom_mask(spread);
            uint8_t held = 0;
            for (int l = 0; l < layers && !held; l++) held = (bits[l][spread & last[l]] & mask) == mask;
            o[i] = held;
        }
        Py_END_ALLOW_THREADS
    }
    for (int l = 0; l < layers; l++) PyBuffer_Release(&views[l]);
    PyBuffer_Release(&out);
    PyBuffer_Release(&keys);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* The first field of a packed record, a str: its id (NULL, no error set, when the data is laid out otherwise). */
static PyObject *packed_id(const uint8_t *in, Py_ssize_t size) {
    Py_ssize_t at = 1, n = -1;
    if (size >= 2 && (in[0] & 0xf0) == 0x90 && in[0] != 0x90) {
        uint8_t head = in[at++];
        if ((head & 0xe0) == 0xa0) n = head & 0x1f;
        else if (head == 0xd9 && at + 1 <= size) { n = in[at]; at += 1; }
        else if (head == 0xda && at + 2 <= size) { n = ((Py_ssize_t)in[at] << 8) | in[at + 1]; at += 2; }
        else if (head == 0xdb && at + 4 <= size) {
            n = (Py_ssize_t)(((uint32_t)in[at] << 24) | ((uint32_t)in[at + 1] << 16) | ((uint32_t)in[at + 2] << 8) | in[at + 3]);
            at += 4;
        }
    }
    PyObject *result = NULL;
    if (n >= 0 && at + n <= size) {
        result = PyUnicode_DecodeUTF8((const char *)in + at, n, NULL);
        if (!result) PyErr_Clear();
    }
    return result;
}

static PyObject *record_id(PyObject *self, PyObject *args) {
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data)) return NULL;
    PyObject *result = packed_id(data.buf, data.len);
    PyBuffer_Release(&data);
    if (!result) Py_RETURN_NONE;
    return result;
}

static PyObject *big_endian_keys(PyObject *self, PyObject *args) {
    PyObject *serials;
    int width;
    if (!PyArg_ParseTuple(args, "O!i", &PyList_Type, &serials, &width)) return NULL;
    if (width < 1 || width > 8) {
        PyErr_SetString(PyExc_ValueError, "width: 1 to 8 bytes");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(serials);
    PyObject *result = PyList_New(n);
    for (Py_ssize_t i = 0; result && i < n; i++) {
        PyObject *number = PyNumber_Index(PyList_GET_ITEM(serials, i));
        unsigned long long value = number ? PyLong_AsUnsignedLongLong(number) : 0;
        Py_XDECREF(number);
        if (!number || (value == (unsigned long long)-1 && PyErr_Occurred())) { Py_CLEAR(result); break; }
        if (width < 8 && value >> (8 * width)) {
            PyErr_SetString(PyExc_OverflowError, "int too big to convert");
            Py_CLEAR(result);
            break;
        }
        PyObject *key = PyBytes_FromStringAndSize(NULL, width);
        if (!key) { Py_CLEAR(result); break; }
        uint8_t *out = (uint8_t *)PyBytes_AS_STRING(key);
        for (int b = width - 1; b >= 0; b--, value >>= 8) out[b] = (uint8_t)value;
        PyList_SET_ITEM(result, i, key);
    }
    return result;
}

static PyObject *row_pairs(PyObject *self, PyObject *args) {
    Py_buffer keys, values;
    Py_ssize_t key_width, value_width;
    if (!PyArg_ParseTuple(args, "y*y*nn", &keys, &values, &key_width, &value_width)) return NULL;
    PyObject *result = NULL;
    if (key_width < 1 || value_width < 1 || keys.len % key_width || values.len % value_width
        || keys.len / key_width != values.len / value_width) {
        PyErr_SetString(PyExc_ValueError, "row_pairs: keys and values of as many rows of their widths");
        goto done;
    }
    Py_ssize_t n = keys.len / key_width;
    result = PyList_New(n);
    const char *key = (const char *)keys.buf, *value = (const char *)values.buf;
    PyObject *last = NULL; /* the row before's key: a bucket's rows share one bytes object */
    for (Py_ssize_t i = 0; result && i < n; i++, key += key_width, value += value_width) {
        PyObject *k;
        if (last && !memcmp(key - key_width, key, (size_t)key_width)) {
            Py_INCREF(last);
            k = last;
        } else {
            k = PyBytes_FromStringAndSize(key, key_width);
        }
        last = k;
        PyObject *v = k ? PyBytes_FromStringAndSize(value, value_width) : NULL;
        PyObject *pair = v ? PyTuple_New(2) : NULL;
        if (!pair) {
            Py_XDECREF(k);
            Py_XDECREF(v);
            Py_CLEAR(result);
            break;
        }
        PyTuple_SET_ITEM(pair, 0, k);
        PyTuple_SET_ITEM(pair, 1, v);
        PyList_SET_ITEM(result, i, pair);
    }
done:
    PyBuffer_Release(&keys);
    PyBuffer_Release(&values);
    return result;
}

/* A getmulti pair's key (bytes of at most 8) as the int it is big-endian, and its value (borrowed); -1 with an error
 * set for a pair of another shape. */
static int fetched_pair(PyObject *pair, PyObject **serial, PyObject **value) {
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(pair, 0))) {
        PyErr_SetString(PyExc_TypeError, "pairs: (bytes key, value) tuples, as getmulti gives them");
        return -1;
    }
    PyObject *key = PyTuple_GET_ITEM(pair, 0);
    Py_ssize_t size = PyBytes_GET_SIZE(key);
    if (size > 8) {
        PyErr_SetString(PyExc_ValueError, "pairs: keys of at most 8 bytes");
        return -1;
    }
    const uint8_t *in = (const uint8_t *)PyBytes_AS_STRING(key);
    unsigned long long number = 0;
    for (Py_ssize_t b = 0; b < size; b++) number = (number << 8) | in[b];
    *serial = PyLong_FromUnsignedLongLong(number);
    *value = PyTuple_GET_ITEM(pair, 1);
    return *serial ? 0 : -1;
}

/* getmulti's pairs by serial: their values (ids false) or the ids of the packed records they are (ids true). */
static PyObject *pairs_by_serial(PyObject *args, int ids) {
    PyObject *pairs;
    if (!PyArg_ParseTuple(args, "O!", &PyList_Type, &pairs)) return NULL;
    PyObject *result = PyDict_New();
    for (Py_ssize_t i = 0; result && i < PyList_GET_SIZE(pairs); i++) {
        PyObject *serial, *value;
        if (fetched_pair(PyList_GET_ITEM(pairs, i), &serial, &value) < 0) { Py_CLEAR(result); break; }
        PyObject *held = value;
        if (ids) {
            Py_buffer data;
            if (PyObject_GetBuffer(value, &data, PyBUF_SIMPLE) < 0) { Py_DECREF(serial); Py_CLEAR(result); break; }
            held = packed_id(data.buf, data.len);
            PyBuffer_Release(&data);
            if (!held) held = Py_NewRef(Py_None);
        }
        int failed = PyDict_SetItem(result, serial, held);
        Py_DECREF(serial);
        if (ids) Py_DECREF(held);
        if (failed < 0) Py_CLEAR(result);
    }
    return result;
}

static PyObject *by_serial(PyObject *self, PyObject *args) { return pairs_by_serial(args, 0); }

static PyObject *record_ids(PyObject *self, PyObject *args) { return pairs_by_serial(args, 1); }

/* Set the bits of keys (uint64) in one layer (a 1-tuple: the same checks as bloom_may_hold's). */
static PyObject *bloom_set(PyObject *self, PyObject *args) {
    PyObject *o_keys, *o_layers;
    if (!PyArg_ParseTuple(args, "OO", &o_keys, &o_layers)) return NULL;
    Py_buffer keys, views[BLOOM_LAYERS];
    if (get_buffer(o_keys, &keys, 8, 0, "keys") < 0) return NULL;
    int layers = bloom_layers(o_layers, views, 1);
    if (layers < 0) { PyBuffer_Release(&keys); return NULL; }
    if (layers != 1) {
        PyErr_SetString(PyExc_ValueError, "bloom_set: one layer");
    } else {
        const uint64_t *k = keys.buf;
        uint64_t *bits = views[0].buf, last = (uint64_t)(views[0].len / 8) - 1;
        Py_ssize_t n = keys.len / 8;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (i + BLOOM_AHEAD < n) __builtin_prefetch(&bits[(k[i + BLOOM_AHEAD] * BLOOM_SPREAD) & last], 1);
            uint64_t spread = k[i] * BLOOM_SPREAD;
            bits[spread & last] |= bloom_mask(spread);
        }
    }
    for (int l = 0; l < layers; l++) PyBuffer_Release(&views[l]);
    PyBuffer_Release(&keys);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* index_rows: what write_documents files of each decided record (see the module comment). */
static PyObject *serial_bytes(PyObject *serial, int width) {
    unsigned long long v = PyLong_AsUnsignedLongLong(serial);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    if (width == 4 && v > 0xffffffffULL) {
        PyErr_SetString(PyExc_OverflowError, "index_rows: a serial past 4 bytes");
        return NULL;
    }
    unsigned char b[8];
    for (int i = 0; i < width; i++) b[i] = (unsigned char)(v >> (8 * (width - 1 - i)));
    return PyBytes_FromStringAndSize((const char *)b, width);
}

/* mirror.pack_recent(ident, content, keys, places): places None, or an int of 8 bytes big-endian. */
static PyObject *recent_value(PyObject *ident, PyObject *content, PyObject *keys, PyObject *places) {
    if (!PyBytes_Check(ident) || !PyBytes_Check(content) || !PyBytes_Check(keys)) {
        PyErr_SetString(PyExc_TypeError, "index_rows: id hash, content hash and band keys must be bytes");
        return NULL;
    }
    Py_ssize_t a = PyBytes_GET_SIZE(ident), b = PyBytes_GET_SIZE(content), c = PyBytes_GET_SIZE(keys);
    unsigned long long bits = 0;
    if (places != NULL) {
        bits = PyLong_AsUnsignedLongLong(places);
        if (bits == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    }
    PyObject *value = PyBytes_FromStringAndSize(NULL, a + b + c + (places ? 8 : 0));
    if (!value) return NULL;
    char *w = PyBytes_AS_STRING(value);
    memcpy(w, PyBytes_AS_STRING(ident), (size_t)a);
    memcpy(w + a, PyBytes_AS_STRING(content), (size_t)b);
    memcpy(w + a + b, PyBytes_AS_STRING(keys), (size_t)c);
    if (places)
        for (int i = 0; i < 8; i++) w[a + b + c + i] = (char)(unsigned char)(bits >> (8 * (7 - i)));
    return value;
}

static PyObject *index_rows(PyObject *self, PyObject *args) {
    PyObject *records, *idents, *recent_keys, *placed;
    if (!PyArg_ParseTuple(args, "O!O!O!O!", &PyList_Type, &records, &PyList_Type, &idents, &PyDict_Type,
                          &recent_keys, &PyDict_Type, &placed)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(records);
    if (PyList_GET_SIZE(idents) != n) {
        PyErr_SetString(PyExc_ValueError, "index_rows: one id hash a record");
        return NULL;
    }
    for (int i = 0; i < R_FIELDS; i++)
        if (!record_names[i] && !(record_names[i] = PyUnicode_InternFromString(record_fields[i]))) return NULL;
    PyObject *keys = PyList_New(n), *recent = PyList_New(n), *members = PyList_New(0), *entries = PyList_New(n);
    PyObject *empty = PyBytes_FromStringAndSize("", 0), *result = NULL;
    long long exact = 0;
    if (!keys || !recent || !members || !entries || !empty) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *record = PyList_GET_ITEM(records, i), *ident = PyList_GET_ITEM(idents, i);
        PyObject *serial = PyObject_GetAttr(record, record_names[R_SERIAL]);
        PyObject *content = serial ? PyObject_GetAttr(record, record_names[R_CONTENT]) : NULL;
        PyObject *kept = content ? PyObject_GetAttr(record, record_names[R_KEPT]) : NULL;
        PyObject *is_exact = kept ? PyObject_GetAttr(record, record_names[R_EXACT]) : NULL;
        PyObject *key = NULL, *wide = NULL, *value = NULL, *pair = NULL, *entry = NULL;
        int ok = 0;
        if (!is_exact) goto record_done;
        int truth = PyObject_IsTrue(is_exact), keeps = PyObject_IsTrue(kept);
        if (truth < 0 || keeps < 0) goto record_done;
        exact += truth;
        if (!(key = serial_bytes(serial, 4)) || !(wide = serial_bytes(serial, 8))) goto record_done;
        PyObject *band_keys = PyDict_GetItemWithError(recent_keys, serial);
        if (!band_keys && PyErr_Occurred()) goto record_done;
        PyObject *place = PyDict_GetItemWithError(placed, serial), *bits = NULL;
        if (!place && PyErr_Occurred()) goto record_done;
        if (place) {
            if (!PyTuple_Check(place) || PyTuple_GET_SIZE(place) != 2) {
                PyErr_SetString(PyExc_TypeError, "index_rows: placed[serial] must be (row, bands)");
                goto record_done;
            }
            bits = PyTuple_GET_ITEM(place, 1);
        }
        if (!(value = recent_value(ident, content, band_keys ? band_keys : empty, bits))) goto record_done;
        if (!(pair = PyTuple_Pack(2, wide, value))) goto record_done;
        if (!(entry = PyTuple_Pack(3, serial, ident, content))) goto record_done;
        if (!keeps) {
            PyObject *cluster = PyObject_GetAttr(record, record_names[R_CLUSTER]);
            PyObject *cluster_key = cluster ? serial_bytes(cluster, 4) : NULL;
            PyObject *member = cluster_key ? PyTuple_Pack(2, cluster_key, key) : NULL;
            int appended = member ? PyList_Append(members, member) : -1;
            Py_XDECREF(cluster);
            Py_XDECREF(cluster_key);
            Py_XDECREF(member);
            if (appended < 0) goto record_done;
        }
        PyList_SET_ITEM(keys, i, key);
        PyList_SET_ITEM(recent, i, pair);
        PyList_SET_ITEM(entries, i, entry);
        key = pair = entry = NULL;
        ok = 1;
    record_done:
        Py_XDECREF(serial);
        Py_XDECREF(content);
        Py_XDECREF(kept);
        Py_XDECREF(is_exact);
        Py_XDECREF(key);
        Py_XDECREF(wide);
        Py_XDECREF(value);
        Py_XDECREF(pair);
        Py_XDECREF(entry);
        if (!ok) goto done;
    }
    result = Py_BuildValue("(OOOLO)", keys, recent, members, exact, entries);
done:
    Py_XDECREF(keys);
    Py_XDECREF(recent);
    Py_XDECREF(members);
    Py_XDECREF(entries);
    Py_XDECREF(empty);
    return result;
}

/* file_firsts: the recent mirror's hashes of committed documents (see the module comment). */
static int file_first(PyObject *first, PyObject *more, PyObject *hash, PyObject *serial) {
    PyObject *held = PyDict_SetDefault(first, hash, serial);  /* borrowed */
    if (!held) return -1;
    if (held == serial) return 0;
    int same = PyObject_RichCompareBool(held, serial, Py_EQ);
    if (same != 0) return same < 0 ? -1 : 0;
    PyObject *later = PyDict_GetItemWithError(more, hash);  /* borrowed */
    if (!later) {
        if (PyErr_Occurred()) return -1;
        PyObject *made = PyList_New(0);
        if (!made || PyDict_SetItem(more, hash, made) < 0) { Py_XDECREF(made); return -1; }
        Py_DECREF(made);
        later = made;
    }
    if (!PyList_Check(later)) {
        PyErr_SetString(PyExc_TypeError, "file_firsts: a later serials entry is not a list");
        return -1;
    }
    return PyList_Append(later, serial);
}

static PyObject *file_firsts(PyObject *self, PyObject *args) {
    PyObject *entries, *first_id, *more_id, *first_content, *more_content;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!", &PyList_Type, &entries, &PyDict_Type, &first_id, &PyDict_Type,
                          &more_id, &PyDict_Type, &first_content, &PyDict_Type, &more_content)) return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(entries); i++) {
        PyObject *entry = PyList_GET_ITEM(entries, i);
        if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 3) {
            PyErr_SetString(PyExc_TypeError, "file_firsts: entries must be (serial, id hash, content hash)");
            return NULL;
        }
        PyObject *serial = PyTuple_GET_ITEM(entry, 0);
        if (file_first(first_id, more_id, PyTuple_GET_ITEM(entry, 1), serial) < 0
            || file_first(first_content, more_content, PyTuple_GET_ITEM(entry, 2), serial) < 0) return NULL;
    }
    Py_RETURN_NONE;
}

/* slotted, kept_alone: objects of a slots dataclass made without a call of its __init__ (see the module
 * comment). setters is (class, the member descriptor of each field, in the order values come): each a
 * writable object slot of the class (what __slots__ makes), whose place in the object is then written at
 * once, as the descriptor's own __set__ would write it into a new object. */
static int setters_check(PyObject *setters, const char *what) {
    if (!PyTuple_Check(setters) || PyTuple_GET_SIZE(setters) < 1 || !PyType_Check(PyTuple_GET_ITEM(setters, 0))) {
        PyErr_Format(PyExc_TypeError, "%s: setters must be (class, descriptor, ...)", what);
        return -1;
    }
    PyTypeObject *type = (PyTypeObject *)PyTuple_GET_ITEM(setters, 0);
    for (Py_ssize_t i = 1; i < PyTuple_GET_SIZE(setters); i++) {
        PyObject *descriptor = PyTuple_GET_ITEM(setters, i);
        if (!Py_IS_TYPE(descriptor, &PyMemberDescr_Type)) {
            PyErr_Format(PyExc_TypeError, "%s: a setter that is not a slot", what);
            return -1;
        }
        PyMemberDef *member = ((PyMemberDescrObject *)descriptor)->d_member;
        if (member->type != Py_T_OBJECT_EX || (member->flags & Py_READONLY)
            || !PyType_IsSubtype(type, PyDescr_TYPE(descriptor))) {
            PyErr_Format(PyExc_TypeError, "%s: a setter that is not a writable object slot of the class", what);
            return -1;
        }
    }
    return 0;
}

/* An object of setters' class with values in its slots (setters checked by setters_check). */
static PyObject *made(PyObject *setters, PyObject *const *values, Py_ssize_t n) {
    if (n != PyTuple_GET_SIZE(setters) - 1) {
        PyErr_Format(PyExc_TypeError, "slotted: %zd values for %zd fields", n, PyTuple_GET_SIZE(setters) - 1);
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)PyTuple_GET_ITEM(setters, 0);
    PyObject *object = type->tp_alloc(type, 0);
    if (!object) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyMemberDef *member = ((PyMemberDescrObject *)PyTuple_GET_ITEM(setters, i + 1))->d_member;
        PyObject **slot = (PyObject **)((char *)object + member->offset);
        PyObject *old = *slot;
        Py_INCREF(values[i]);
        *slot = values[i];
        Py_XDECREF(old);  /* NULL in a new object, unless a field is named twice */
    }
    return object;
}

static PyObject *slotted(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "slotted: setters, then the values");
        return NULL;
    }
    if (setters_check(args[0], "slotted") < 0) return NULL;
    return made(args[0], args + 1, nargs - 1);
}

/* kept_alone's context: what a batch's rows surely kept need (decide._State.alone_context). */
enum { K_ITEMS, K_ROWS, K_ID_KEYS, K_CONTENTS, K_SITES, K_REKEYED, K_NOW, K_RECORDS, K_BY_ID, K_BY_CONTENT,
       K_DECISIONS, K_RECORD_SETTERS, K_DECISION_SETTERS, K_KEPT, K_MATCHES, K_SIMILARITIES, K_COUNTS, K_NAMES,
       K_DUPLICATE, K_TWINS, K_SOURCE, K_FIELDS };
static PyObject *id_name, *source_name, *as_list_name, *empty_bytes, *one_float, *source_fields[3];

static int kept_context_check(PyObject *c) {
    if (!PyTuple_Check(c) || PyTuple_GET_SIZE(c) != K_FIELDS) {
        PyErr_SetString(PyExc_TypeError, "kept_alone: the context is a tuple of 21");
        return -1;
    }
    int lists[] = {K_ITEMS, K_ROWS, K_ID_KEYS, K_CONTENTS, K_SITES, K_DECISIONS, K_MATCHES, K_SIMILARITIES, K_COUNTS,
                   K_TWINS};
    int dicts[] = {K_REKEYED, K_RECORDS, K_BY_ID, K_BY_CONTENT, K_NAMES};
    for (size_t i = 0; i < sizeof lists / sizeof *lists; i++)
        if (!PyList_Check(PyTuple_GET_ITEM(c, lists[i]))) {
            PyErr_SetString(PyExc_TypeError, "kept_alone: items, rows, hashes, sites, decisions and outcomes are lists");
            return -1;
        }
    for (size_t i = 0; i < sizeof dicts / sizeof *dicts; i++)
        if (!PyDict_Check(PyTuple_GET_ITEM(c, dicts[i]))) {
            PyErr_SetString(PyExc_TypeError, "kept_alone: rekeyed, records, by_id, by_content and names are dicts");
            return -1;
        }
    if (PyTuple_GET_SIZE(PyTuple_GET_ITEM(c, K_RECORD_SETTERS)) != R_FIELDS + 1
        || PyTuple_GET_SIZE(PyTuple_GET_ITEM(c, K_DECISION_SETTERS)) != 12) {
        PyErr_SetString(PyExc_TypeError, "kept_alone: a record has 16 fields, a decision 11");
        return -1;
    }
    if (setters_check(PyTuple_GET_ITEM(c, K_RECORD_SETTERS), "kept_alone") < 0
        || setters_check(PyTuple_GET_ITEM(c, K_DECISION_SETTERS), "kept_alone") < 0) return -1;
    if (!id_name && !(id_name = PyUnicode_InternFromString("id"))) return -1;
    if (!source_name && !(source_name = PyUnicode_InternFromString("source"))) return -1;
    if (!as_list_name && !(as_list_name = PyUnicode_InternFromString("as_list"))) return -1;
    if (!empty_bytes && !(empty_bytes = PyBytes_FromStringAndSize("", 0))) return -1;
    if (!one_float && !(one_float = PyFloat_FromDouble(1.0))) return -1;
    static const char *names[3] = {"name", "partition", "offset"};
    for (int i = 0; i < 3; i++)
        if (!source_fields[i] && !(source_fields[i] = PyUnicode_InternFromString(names[i]))) return -1;
    if (!PyType_Check(PyTuple_GET_ITEM(c, K_SOURCE))) {
        PyErr_SetString(PyExc_TypeError, "kept_alone: the context's last field is records.Source");
        return -1;
    }
    return 0;
}

/* by_id.setdefault(ident, []).append(serial) */
static int file_serial(PyObject *by_id, PyObject *ident, PyObject *serial) {
    PyObject *serials = PyDict_GetItemWithError(by_id, ident);  /* borrowed */
    if (!serials) {
        if (PyErr_Occurred() || !(serials = PyList_New(0))) return -1;
        int set = PyDict_SetItem(by_id, ident, serials);
        Py_DECREF(serials);
        if (set < 0) return -1;
    }
    if (!PyList_Check(serials)) {
        PyErr_SetString(PyExc_TypeError, "kept_alone: by_id holds lists");
        return -1;
    }
    return PyList_Append(serials, serial);
}

/* ===== Rows decided from the store's evidence alone (hot36) =====
 * Besides rows surely kept, kept_alone takes the rows whose only candidates are stored documents that the
 * evidence verified (decide._State.quick_rows): counts[row] of them (0: a row surely kept), matches[row] the
 * best at or above the threshold (None: none), similarities[row] its Jaccard, names[match] its id. Such a row
 * is a near duplicate of its match (DocRecord.near_duplicate), or kept; its decision counts its candidates,
 * all verified (decide._as_decision). */

/* The row's match and its id (both borrowed; match None: kept), or -1 with an error set. */
static int quick_match(PyObject *c, Py_ssize_t r, PyObject **match, PyObject **name) {
    PyObject *matches = PyTuple_GET_ITEM(c, K_MATCHES);
    if (r >= PyList_GET_SIZE(matches) || r >= PyList_GET_SIZE(PyTuple_GET_ITEM(c, K_SIMILARITIES))
        || r >= PyList_GET_SIZE(PyTuple_GET_ITEM(c, K_COUNTS))) {
        PyErr_SetString(PyExc_IndexError, "kept_alone: a row out of the outcomes");
        return -1;
    }
    *match = PyList_GET_ITEM(matches, r);
    *name = NULL;
    if (*match == Py_None) return 0;
    *name = PyDict_GetItemWithError(PyTuple_GET_ITEM(c, K_NAMES), *match);
    if (!*name) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_KeyError, "kept_alone: a match without a name");
        return -1;
    }
    return 0;
}

/* The row's stored twin, (cluster, its id, twin, its id) borrowed, or NULL: not an exact copy (decide._State
 * quick_twins); -1 with an error set. */
static int quick_twin(PyObject *c, Py_ssize_t r, PyObject **twin) {
    PyObject *twins = PyTuple_GET_ITEM(c, K_TWINS);
    if (r >= PyList_GET_SIZE(twins)) {
        PyErr_SetString(PyExc_IndexError, "kept_alone: a row out of the twins");
        return -1;
    }
    *twin = PyList_GET_ITEM(twins, r);
    if (*twin == Py_None) {
        *twin = NULL;
        return 0;
    }
    if (!PyTuple_Check(*twin) || PyTuple_GET_SIZE(*twin) != 4) {
        PyErr_SetString(PyExc_TypeError, "kept_alone: a twin is (cluster, cluster id, serial, id)");
        return -1;
    }
    return 0;
}

/* ===== end of the rows decided from the store's evidence (hot36) ===== */

/* source.as_list() (records.Source.as_list: [name, partition, offset]), its attributes read here when source is
 * of that very class (source_type), not through a call. */
static PyObject *source_list(PyObject *source, PyObject *source_type) {
    if ((PyObject *)Py_TYPE(source) != source_type) return PyObject_CallMethodNoArgs(source, as_list_name);
    PyObject *list = PyList_New(3);
    if (!list) return NULL;
    for (int i = 0; i < 3; i++) {
        PyObject *value = PyObject_GetAttr(source, source_fields[i]);
        if (!value) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, value);
    }
    return list;
}

/* Item i (a document, row surely kept or decided from the store's evidence) as serial: decide._State.kept_alone's
 * steps. */
static int keep_alone(PyObject *c, Py_ssize_t i, PyObject *serial) {
    PyObject *doc = PyList_GET_ITEM(PyTuple_GET_ITEM(c, K_ITEMS), i);
    PyObject *row = PyList_GET_ITEM(PyTuple_GET_ITEM(c, K_ROWS), i);
    Py_ssize_t r = PyLong_AsSsize_t(row);
    if (r == -1 && PyErr_Occurred()) return -1;
    PyObject *id_keys = PyTuple_GET_ITEM(c, K_ID_KEYS), *contents = PyTuple_GET_ITEM(c, K_CONTENTS);
    PyObject *sites = PyTuple_GET_ITEM(c, K_SITES);
    if (r < 0 || r >= PyList_GET_SIZE(id_keys) || r >= PyList_GET_SIZE(contents) || r >= PyList_GET_SIZE(sites)) {
        PyErr_SetString(PyExc_IndexError, "kept_alone: a row out of the batch");
        return -1;
    }
    PyObject *ident = PyList_GET_ITEM(id_keys, r), *content = PyList_GET_ITEM(contents, r), *match, *name, *twin;
    if (quick_match(c, r, &match, &name) < 0 || quick_twin(c, r, &twin) < 0) return -1;
    PyObject *similarity = PyList_GET_ITEM(PyTuple_GET_ITEM(c, K_SIMILARITIES), r);
    PyObject *count = PyList_GET_ITEM(PyTuple_GET_ITEM(c, K_COUNTS), r);
    PyObject *keys = PyDict_GetItemWithError(PyTuple_GET_ITEM(c, K_REKEYED), row);
    if (!keys && PyErr_Occurred()) return -1;
    PyObject *id = PyObject_GetAttr(doc, id_name), *source = id ? PyObject_GetAttr(doc, source_name) : NULL;
    PyObject *places = source ? source_list(source, PyTuple_GET_ITEM(c, K_SOURCE)) : NULL;
    PyObject *record = NULL, *pair = NULL, *decision = NULL;
    int result = -1;
    if (!places) goto done;
    PyObject *kept[R_FIELDS] = {serial, id, Py_True, serial, id, Py_None, Py_None, Py_None, Py_False, content,
                                places, keys ? keys : empty_bytes, PyTuple_GET_ITEM(c, K_NOW), Py_False,
                                PyList_GET_ITEM(sites, r), Py_None};
    PyObject *near[R_FIELDS] = {serial, id, Py_False, match, name, match, name, similarity, Py_False, content,
                                places, empty_bytes, PyTuple_GET_ITEM(c, K_NOW), Py_False,
                                PyList_GET_ITEM(sites, r), Py_None};
    PyObject *copy[R_FIELDS] = {serial, id, Py_False, twin ? PyTuple_GET_ITEM(twin, 0) : NULL,
                                twin ? PyTuple_GET_ITEM(twin, 1) : NULL, twin ? PyTuple_GET_ITEM(twin, 2) : NULL,
                                twin ? PyTuple_GET_ITEM(twin, 3) : NULL, one_float, Py_True, content, places,
                                empty_bytes, PyTuple_GET_ITEM(c, K_NOW), Py_False, PyList_GET_ITEM(sites, r),
                                Py_None};  /* DocRecord.exact_copy_of */
    if (!(record = made(PyTuple_GET_ITEM(c, K_RECORD_SETTERS), twin ? copy : name ? near : kept, R_FIELDS)))
        goto done;
    if (!(pair = PyTuple_Pack(2, record, row))) goto done;
    if (PyDict_SetItem(PyTuple_GET_ITEM(c, K_RECORDS), serial, pair) < 0) goto done;
    if (file_serial(PyTuple_GET_ITEM(c, K_BY_ID), ident, serial) < 0) goto done;
    if (!PyDict_SetDefault(PyTuple_GET_ITEM(c, K_BY_CONTENT), content, serial)) goto done;
    PyObject *outcome[11] = {id, PyTuple_GET_ITEM(c, K_KEPT), id, Py_None, Py_None, Py_None, Py_False, Py_False,
                             count, count, Py_None};
    PyObject *duplicate[11] = {id, PyTuple_GET_ITEM(c, K_DUPLICATE), name, name, similarity, Py_None, Py_False,
                               Py_False, count, count, Py_None};
    PyObject *exact[11] = {id, PyTuple_GET_ITEM(c, K_DUPLICATE), copy[4], copy[6], one_float, Py_None, Py_True,
                           Py_False, count, count, Py_None};  /* count: 0, an exact copy looks nothing up */
    if (!(decision = made(PyTuple_GET_ITEM(c, K_DECISION_SETTERS), twin ? exact : name ? duplicate : outcome, 11)))
        goto done;
    result = PyList_SetItem(PyTuple_GET_ITEM(c, K_DECISIONS), i, decision);  /* steals it */
    decision = NULL;
done:
    Py_XDECREF(id);
    Py_XDECREF(source);
    Py_XDECREF(places);
    Py_XDECREF(record);
    Py_XDECREF(pair);
    Py_XDECREF(decision);
    return result;
}

static PyObject *kept_alone(PyObject *self, PyObject *args) {
    PyObject *c;
    Py_ssize_t start, stop;
    long long serial;
    if (!PyArg_ParseTuple(args, "OnnL", &c, &start, &stop, &serial)) return NULL;
    if (kept_context_check(c) < 0) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(PyTuple_GET_ITEM(c, K_ITEMS));
    if (start < 0 || stop > n || PyList_GET_SIZE(PyTuple_GET_ITEM(c, K_ROWS)) < n
        || PyList_GET_SIZE(PyTuple_GET_ITEM(c, K_DECISIONS)) < n) {
        PyErr_SetString(PyExc_IndexError, "kept_alone: items out of the batch");
        return NULL;
    }
    for (Py_ssize_t i = start; i < stop; i++, serial++) {
        PyObject *number = PyLong_FromLongLong(serial);
        int kept = number ? keep_alone(c, i, number) : -1;
        Py_XDECREF(number);
        if (kept < 0) return NULL;
    }
    return PyLong_FromLongLong(serial);
}

/* decision_lines: the decisions file's lines of a batch (see the module comment). */
enum { D_ID, D_STATUS, D_CLUSTER, D_MATCHED, D_SIMILARITY, D_REASON, D_CONTAINMENT, D_FIELDS };
static const char *decision_fields[D_FIELDS] = {"id", "status", "cluster", "matched", "similarity", "reason",
                                                "containment"};
static PyObject *decision_names[D_FIELDS];
static PyObject *kept_status, *relation_name;

/* The id as a JSON string (json.encoder.encode_basestring: '"', '\\' and control characters escaped). */
static int out_json_string(Out *out, const char *text, Py_ssize_t n) {
    static const char hex[] = "0123456789abcdef";
    if (out_reserve(out, 6 * n + 2) < 0) return -1;
    unsigned char *w = out->data + out->size;
    *w++ = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c >= 0x20 && c != '"' && c != '\\') { *w++ = c; continue; }
        *w++ = '\\';
        switch (c) {
            case '"': *w++ = '"'; break;
            case '\\': *w++ = '\\'; break;
            case '\n': *w++ = 'n'; break;
            case '\r': *w++ = 'r'; break;
            case '\t': *w++ = 't'; break;
            case '\b': *w++ = 'b'; break;
            case '\f': *w++ = 'f'; break;
            default: *w++ = 'u'; *w++ = '0'; *w++ = '0'; *w++ = hex[c >> 4]; *w++ = hex[c & 15];
        }
    }
    *w++ = '"';
    out->size = w - out->data;
    return 0;
}

/* JSON of an optional str: null, or the string (0); 1: not a str (decision_line says what it makes of it). */
static int out_optional_string(Out *out, PyObject *text) {
    if (text == Py_None) return out_bytes(out, "null", 4);
    if (!PyUnicode_CheckExact(text)) return 1;
    Py_ssize_t n;
    const char *utf8 = PyUnicode_AsUTF8AndSize(text, &n);
    if (!utf8) { PyErr_Clear(); return 1; } /* not UTF-8 (a lone surrogate) */
    return out_json_string(out, utf8, n);
}

/* messages.similarity_json: null, or repr(round(x, 6)) of a float (0); 1: another type. */
static PyObject *round_builtin, *similarity_texts;  /* the text of each similarity seen (by its bits), bounded */
static int out_similarity(Out *out, PyObject *x) {
    if (x == Py_None) return out_bytes(out, "null", 4);
    if (!PyFloat_CheckExact(x)) return 1;
    double value = PyFloat_AS_DOUBLE(x);
    uint64_t bits;
    memcpy(&bits, &value, sizeof bits);
    PyObject *key = PyLong_FromUnsignedLongLong(bits);
    if (!key) return -1;
    PyObject *text = PyDict_GetItemWithError(similarity_texts, key);  /* borrowed */
    if (text) {
        Py_DECREF(key);
        return out_bytes(out, PyBytes_AS_STRING(text), PyBytes_GET_SIZE(text));
    }
    if (PyErr_Occurred()) { Py_DECREF(key); return -1; }
    PyObject *rounded = PyObject_CallFunction(round_builtin, "Oi", x, 6);
    PyObject *shown = rounded ? PyObject_Repr(rounded) : NULL;
    Py_XDECREF(rounded);
    text = shown ? PyUnicode_AsUTF8String(shown) : NULL;
    Py_XDECREF(shown);
    if (!text) { Py_DECREF(key); return -1; }
    if (PyDict_GET_SIZE(similarity_texts) >= 1 << 16) PyDict_Clear(similarity_texts);
    int r = PyDict_SetItem(similarity_texts, key, text) < 0 ? -1
            : out_bytes(out, PyBytes_AS_STRING(text), PyBytes_GET_SIZE(text));
    Py_DECREF(key);
    Py_DECREF(text);
    return r;
}

/* One decision's line as decision_line writes it: 0 written, 1 left to decision_line (nothing written that
 * counts: the caller drops it), -1 an error. */
static int decision_line_into(Out *out, PyObject *decision) {
    PyObject *f[D_FIELDS] = {NULL}, *relation = NULL;
    int result = -1, e;
    for (int i = 0; i < D_FIELDS; i++)
        if (!(f[i] = PyObject_GetAttr(decision, decision_names[i]))) goto done;
    result = 1;
    if (!PyUnicode_CheckExact(f[D_ID]) || !PyUnicode_CheckExact(f[D_STATUS])) goto done;
    if ((e = PyUnicode_Compare(f[D_STATUS], kept_status)) == -1 && PyErr_Occurred()) { result = -1; goto done; }
    int new_cluster = e == 0 && f[D_MATCHED] == Py_None && f[D_SIMILARITY] == Py_None && f[D_REASON] == Py_None
                      && f[D_CONTAINMENT] == Py_None;
    if (new_cluster && f[D_CLUSTER] != f[D_ID] && (new_cluster = equal(f[D_CLUSTER], f[D_ID])) < 0) {
        result = -1;
        goto done;
    }
    Py_ssize_t n;
    const char *id = PyUnicode_AsUTF8AndSize(f[D_ID], &n);
    if (!id) { PyErr_Clear(); goto done; } /* not UTF-8 (a lone surrogate): decision_line says what it makes of it */
    if (new_cluster) {  /* most lines: a new cluster, named by its own id */
        static const char head[] = "{\"id\": ", mid[] = ", \"status\": \"kept\", \"cluster\": ",
            tail[] = ", \"matched\": null, \"similarity\": null, \"reason\": null, \"relation\": null, "
                     "\"containment\": null}\n";
        result = out_bytes(out, head, sizeof head - 1) < 0 || out_json_string(out, id, n) < 0
                 || out_bytes(out, mid, sizeof mid - 1) < 0 || out_json_string(out, id, n) < 0
                 || out_bytes(out, tail, sizeof tail - 1) < 0 ? -1 : 0;
        goto done;
    }
    if (!(relation = PyObject_GetAttr(decision, relation_name))) { result = -1; goto done; }
    const char *parts[8] = {"{\"id\": ", ", \"status\": ", ", \"cluster\": ", ", \"matched\": ", ", \"similarity\": ",
                            ", \"reason\": ", ", \"relation\": ", ", \"containment\": "};
    PyObject *values[8] = {f[D_ID], f[D_STATUS], f[D_CLUSTER], f[D_MATCHED], f[D_SIMILARITY], f[D_REASON], relation,
                           f[D_CONTAINMENT]};
    for (int i = 0; i < 8; i++) {
        if (out_bytes(out, parts[i], (Py_ssize_t)strlen(parts[i])) < 0) { result = -1; goto done; }
        int r = i == 4 || i == 7 ? out_similarity(out, values[i]) : out_optional_string(out, values[i]);
        if (r != 0) { result = r; goto done; }
    }
    result = out_bytes(out, "}\n", 2) < 0 ? -1 : 0;
done:
    for (int i = 0; i < D_FIELDS; i++) Py_XDECREF(f[i]);
    Py_XDECREF(relation);
    return result;
}

static PyObject *decision_lines(PyObject *self, PyObject *args) {
    PyObject *decisions, *line;
    if (!PyArg_ParseTuple(args, "O!O", &PyList_Type, &decisions, &line)) return NULL;
    for (int i = 0; i < D_FIELDS; i++)
        if (!decision_names[i] && !(decision_names[i] = PyUnicode_InternFromString(decision_fields[i]))) return NULL;
    if (!kept_status && !(kept_status = PyUnicode_InternFromString("kept"))) return NULL;
    if (!relation_name && !(relation_name = PyUnicode_InternFromString("relation"))) return NULL;
    if (!similarity_texts && !(similarity_texts = PyDict_New())) return NULL;
    if (!round_builtin) {
        PyObject *builtins = PyEval_GetBuiltins();  /* borrowed */
        round_builtin = builtins ? PyDict_GetItemString(builtins, "round") : NULL;
        if (!round_builtin) {
            PyErr_SetString(PyExc_RuntimeError, "decision_lines: no builtin round");
            return NULL;
        }
        Py_INCREF(round_builtin);
    }
    Out out = {NULL, 0, 0};
    PyObject *joined = NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(decisions); i++) {
        PyObject *decision = PyList_GET_ITEM(decisions, i);
        Py_ssize_t began = out.size;
        int r = decision_line_into(&out, decision);
        if (r < 0) goto done;
        if (r == 0) continue;
        out.size = began;
        PyObject *other = PyObject_CallOneArg(line, decision);
        if (!other) goto done;
        if (!PyBytes_Check(other)) {
            PyErr_SetString(PyExc_TypeError, "decision_lines: line(decision) must give bytes");
            Py_DECREF(other);
            goto done;
        }
        int w = out_bytes(&out, PyBytes_AS_STRING(other), PyBytes_GET_SIZE(other));
        Py_DECREF(other);
        if (w < 0) goto done;
    }
    joined = PyBytes_FromStringAndSize(out.size ? (const char *)out.data : "", out.size);
done:
    free(out.data);
    return joined;
}

/* Kafka record batches (format v2, magic 2), as kafka-python's DefaultRecordBatchBuilder writes them. */

static int varint_bytes(int64_t value) {
    uint64_t z = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    int n = 1;
    while (z > 0x7F) { z >>= 7; n++; }
    return n;
}

static void put_varint(Out *out, int64_t value) {  /* room reserved by the caller */
    uint64_t z = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    while (z > 0x7F) { out->data[out->size++] = (unsigned char)((z & 0x7F) | 0x80); z >>= 7; }
    out->data[out->size++] = (unsigned char)z;
}

/* A key, value or header value: NULL data for None; bytes, bytearray or memoryview otherwise. */
typedef struct { const char *data; Py_ssize_t size; Py_buffer view; int viewed; } Field;

static int field_of(Field *f, PyObject *o, const char *what) {
    f->viewed = 0;
    if (o == Py_None) { f->data = NULL; f->size = -1; return 0; }
    if (PyBytes_CheckExact(o)) { f->data = PyBytes_AS_STRING(o); f->size = PyBytes_GET_SIZE(o); return 0; }
    if (PyByteArray_Check(o) || PyMemoryView_Check(o) || PyBytes_Check(o)) {
        if (PyObject_GetBuffer(o, &f->view, PyBUF_C_CONTIGUOUS) < 0) return -1;
        f->viewed = 1;
        f->data = f->view.buf;
        f->size = f->view.len;
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "record_batches: a record's %s must be bytes, bytearray, memoryview or None, not %.80s",
                 what, Py_TYPE(o)->tp_name);
    return -1;
}

static void field_release(Field *f) { if (f->viewed) { PyBuffer_Release(&f->view); f->viewed = 0; } }

static Py_ssize_t field_bytes(const Field *f) { return f->data ? varint_bytes(f->size) + f->size : 1; }

static void put_field(Out *out, const Field *f) {
    put_varint(out, f->data ? f->size : -1);
    if (f->data) { memcpy(out->data + out->size, f->data, (size_t)f->size); out->size += f->size; }
}

/* One record appended to the batch in out: its body's size first, then its bytes. -1: an error set. */
static int put_record(Out *out, PyObject *row, int64_t timestamp_delta, int64_t offset_delta, Py_ssize_t *written,
                      Py_ssize_t room_left, int first) {
    PyObject *headers = PyTuple_GET_ITEM(row, 3);
    Field key, value;
    if (field_of(&key, PyTuple_GET_ITEM(row, 1), "key") < 0) return -1;
    if (field_of(&value, PyTuple_GET_ITEM(row, 2), "value") < 0) { field_release(&key); return -1; }
    int result = -1;
    PyObject *fast = PySequence_Fast(headers, "record_batches: a record's headers must be a list of (str, bytes)");
    if (!fast) goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    Py_ssize_t body = 1 + varint_bytes(timestamp_delta) + varint_bytes(offset_delta) + field_bytes(&key)
                      + field_bytes(&value) + varint_bytes(n);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(fast, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyUnicode_Check(PyTuple_GET_ITEM(pair, 0))) {
            PyErr_SetString(PyExc_TypeError, "record_batches: a header must be a (str, bytes or None) pair");
            goto done;
        }
        Py_ssize_t name_size;
        if (!PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(pair, 0), &name_size)) goto done;
        Field h;
        if (field_of(&h, PyTuple_GET_ITEM(pair, 1), "header value") < 0) goto done;
        body += varint_bytes(name_size) + name_size + field_bytes(&h);
        field_release(&h);
    }
    Py_ssize_t required = varint_bytes(body) + body;
    if (!first && required > room_left) { result = 1; goto done; }  /* the batch is full: the caller starts another */
    if (out_reserve(out, required) < 0) goto done;
    put_varint(out, body);
    out->data[out->size++] = 0;  /* attributes */
    put_varint(out, timestamp_delta);
    put_varint(out, offset_delta);
    put_field(out, &key);
    put_field(out, &value);
    put_varint(out, n);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(fast, i);
        Py_ssize_t name_size;
        const char *name = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(pair, 0), &name_size);
        Field h;
        if (field_of(&h, PyTuple_GET_ITEM(pair, 1), "header value") < 0) goto done;
        put_varint(out, name_size);
        memcpy(out->data + out->size, name, (size_t)name_size);
        out->size += name_size;
        put_field(out, &h);
        field_release(&h);
    }
    *written = required;
    result = 0;
done:
    Py_XDECREF(fast);
    field_release(&key);
    field_release(&value);
    return result;
}

#define RECORD_BATCH_HEADER 61

/* The finished batch (its header left zero) as (bytearray, count, first timestamp, max timestamp, largest record)
 * appended to batches; out is emptied down to a new header. */
static int batch_done(PyObject *batches, Out *out, Py_ssize_t count, int64_t first_ts, int64_t max_ts,
                      Py_ssize_t largest) {
    PyObject *data = PyByteArray_FromStringAndSize((const char *)out->data, out->size);
    if (!data) return -1;
    PyObject *item = Py_BuildValue("(NnLLn)", data, count, (long long)first_ts, (long long)max_ts, largest);
    if (!item) return -1;
    int r = PyList_Append(batches, item);
    Py_DECREF(item);
    out->size = RECORD_BATCH_HEADER;
    memset(out->data, 0, RECORD_BATCH_HEADER);
    return r;
}

static PyObject *record_batches(PyObject *self, PyObject *args) {
    PyObject *rows;
    Py_ssize_t batch_size;
    if (!PyArg_ParseTuple(args, "O!n", &PyList_Type, &rows, &batch_size)) return NULL;
    PyObject *batches = PyList_New(0);
    if (!batches) return NULL;
    Out out = {NULL, 0, 0};
    if (out_reserve(&out, RECORD_BATCH_HEADER) < 0) goto failed;
    memset(out.data, 0, RECORD_BATCH_HEADER);
    out.size = RECORD_BATCH_HEADER;
    Py_ssize_t count = 0, largest = 0;
    int64_t first_ts = 0, max_ts = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(rows); i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != 4) {
            PyErr_SetString(PyExc_TypeError, "record_batches: each record is a (timestamp_ms, key, value, headers) tuple");
            goto failed;
        }
        long long ts = PyLong_AsLongLong(PyTuple_GET_ITEM(row, 0));
        if (ts == -1 && PyErr_Occurred()) goto failed;
        for (;;) {
            Py_ssize_t written = 0;
            int r = put_record(&out, row, count ? (int64_t)ts - first_ts : 0, count, &written,
                               batch_size - out.size, count == 0);
            if (r < 0) goto failed;
            if (r == 1) {  /* full: this record opens the next batch */
                if (batch_done(batches, &out, count, first_ts, max_ts, largest) < 0) goto failed;
                count = 0;
                largest = 0;
                continue;
            }
            if (count == 0) first_ts = max_ts = ts;
            else if (ts > max_ts) max_ts = ts;
            if (written > largest) largest = written;
            count++;
            break;
        }
    }
    if (count && batch_done(batches, &out, count, first_ts, max_ts, largest) < 0) goto failed;
    free(out.data);
    return batches;
failed:
    free(out.data);
    Py_DECREF(batches);
    return NULL;
}

/* ---- json_id_keys: a JSON record's id found in its bytes, for the sharded signer's placing ---- */

/* A validating scan of strict JSON (RFC 8259: what both orjson and json read as the same object), one pass, no
 * objects made. JS_OK: valid; JS_UNSURE: anything else (invalid, or valid but outside what the scan vouches for:
 * nested deeper than JS_DEPTH); the caller then decodes the record as decode.py does. */
#define JS_OK 0
#define JS_UNSURE 1
#define JS_DEPTH 64

typedef struct {
    const uint8_t *p, *end;
} JScan;

static void js_space(JScan *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t')) s->p++;
}

/* The length of the well-formed UTF-8 sequence at p whose lead byte is >= 0x80, as Python's strict decoder
 * takes it (no overlong forms, no surrogates, nothing past U+10FFFF); 0 if it is not one. */
static int utf8_sequence(const uint8_t *p, const uint8_t *end) {
    uint8_t c = p[0];
    Py_ssize_t left = end - p;
    if (c >= 0xc2 && c <= 0xdf) return (left >= 2 && (p[1] & 0xc0) == 0x80) ? 2 : 0;
    if (c >= 0xe0 && c <= 0xef) {
        if (left < 3 || (p[2] & 0xc0) != 0x80) return 0;
        uint8_t lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
        return (p[1] >= lo && p[1] <= hi) ? 3 : 0;
    }
    if (c >= 0xf0 && c <= 0xf4) {
        if (left < 4 || (p[2] & 0xc0) != 0x80 || (p[3] & 0xc0) != 0x80) return 0;
        uint8_t lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
        return (p[1] >= lo && p[1] <= hi) ? 4 : 0;
    }
    return 0;
}

static int utf8_valid(const uint8_t *p, Py_ssize_t n) {
    const uint8_t *end = p + n;
    while (p < end) {
        if (*p < 0x80) { p++; continue; }
        int k = utf8_sequence(p, end);
        if (!k) return 0;
        p += k;
    }
    return 1;
}

#define JS_ONES 0x0101010101010101ULL
#define JS_HIGHS 0x8080808080808080ULL

/* A string from its opening quote: s->p after its closing quote. *escaped: whether it holds an escape; *chars:
 * its code points (escapes counted as written, only meaningful when there is none). */
static int js_string(JScan *s, int *escaped, Py_ssize_t *chars) {
    const uint8_t *p = s->p + 1, *end = s->end;
    Py_ssize_t count = 0;
    *escaped = 0;
    for (;;) {
#if defined(__SSE2__)
        while (end - p >= 16) {  /* sixteen plain ASCII bytes at a time: none < 0x20, '"', '\\' or >= 0x80 */
            __m128i v = _mm_loadu_si128((const __m128i *)p);
            __m128i odd = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('"')),
                                                    _mm_cmpeq_epi8(v, _mm_set1_epi8('\\'))),
                                       _mm_cmplt_epi8(v, _mm_set1_epi8(0x20)));  /* signed: >= 0x80 is < 0x20 too */
            if (_mm_movemask_epi8(odd)) break;
            p += 16;
            count += 16;
        }
#endif
        while (end - p >= 8) {  /* eight plain ASCII bytes at a time: none < 0x20, '"', '\\' or >= 0x80 */
            uint64_t v;
            memcpy(&v, p, 8);
            uint64_t quote = v ^ (JS_ONES * '"'), slash = v ^ (JS_ONES * '\\');
            uint64_t hit = ((v - JS_ONES * 0x20) & ~v) | ((quote - JS_ONES) & ~quote) | ((slash - JS_ONES) & ~slash) | v;
            if (hit & JS_HIGHS) break;
            p += 8;
            count += 8;
        }
        if (p >= end) return JS_UNSURE;
        uint8_t c = *p;
        if (c == '"') {
            s->p = p + 1;
            *chars = count;
            return JS_OK;
        }
        if (c < 0x20) return JS_UNSURE;
        if (c == '\\') {
            *escaped = 1;
            if (end - p < 2) return JS_UNSURE;
            uint8_t e = p[1];
            if (e == 'u') {
                if (end - p < 6) return JS_UNSURE;
                for (int i = 2; i < 6; i++)
                    if (!((p[i] >= '0' && p[i] <= '9') || ((p[i] | 0x20) >= 'a' && (p[i] | 0x20) <= 'f'))) return JS_UNSURE;
                p += 6;
            } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' || e == 't') {
                p += 2;
            } else {
                return JS_UNSURE;
            }
            count++;
            continue;
        }
        if (c >= 0x80) {
            int k = utf8_sequence(p, end);
            if (!k) return JS_UNSURE;
            p += k;
        } else {
            p++;
        }
        count++;
    }
}

/* A number: *integer whether it has neither fraction nor exponent. */
static int js_number(JScan *s, int *integer) {
    const uint8_t *p = s->p, *end = s->end;
    if (p < end && *p == '-') p++;
    if (p >= end) return JS_UNSURE;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') while (p < end && *p >= '0' && *p <= '9') p++;
    else return JS_UNSURE;
    *integer = 1;
    if (p < end && *p == '.') {
        p++;
        if (p >= end || *p < '0' || *p > '9') return JS_UNSURE;
        while (p < end && *p >= '0' && *p <= '9') p++;
        *integer = 0;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || *p < '0' || *p > '9') return JS_UNSURE;
        while (p < end && *p >= '0' && *p <= '9') p++;
        *integer = 0;
    }
    s->p = p;
    return JS_OK;
}

static int js_literal(JScan *s, const char *word, Py_ssize_t n) {
    if (s->end - s->p < n || memcmp(s->p, word, n)) return JS_UNSURE;
    s->p += n;
    return JS_OK;
}

static int js_value(JScan *s, int depth);

static int js_container(JScan *s, int depth, uint8_t close) {
    if (depth > JS_DEPTH) return JS_UNSURE;
    s->p++;
    js_space(s);
    if (s->p < s->end && *s->p == close) { s->p++; return JS_OK; }
    for (;;) {
        if (close == '}') {
            int escaped;
            Py_ssize_t chars;
            if (s->p >= s->end || *s->p != '"' || js_string(s, &escaped, &chars)) return JS_UNSURE;
            js_space(s);
            if (s->p >= s->end || *s->p != ':') return JS_UNSURE;
            s->p++;
            js_space(s);
        }
        if (js_value(s, depth + 1)) return JS_UNSURE;
        js_space(s);
        if (s->p >= s->end) return JS_UNSURE;
        if (*s->p == close) { s->p++; return JS_OK; }
        if (*s->p != ',') return JS_UNSURE;
        s->p++;
        js_space(s);
    }
}

static int js_value(JScan *s, int depth) {
    if (s->p >= s->end) return JS_UNSURE;
    int escaped, integer;
    Py_ssize_t chars;
    switch (*s->p) {
        case '{': return js_container(s, depth, '}');
        case '[': return js_container(s, depth, ']');
        case '"': return js_string(s, &escaped, &chars);
        case 't': return js_literal(s, "true", 4);
        case 'f': return js_literal(s, "false", 5);
        case 'n': return js_literal(s, "null", 4);
        default: return js_number(s, &integer);
    }
}

#define JS_MAX_ID_CHARS 1024  /* decode.MAX_ID_CHARS */
#define JS_MAX_INT_DIGITS 18  /* an integer id of at most this many digits is the same int to orjson and json */

/* The bytes of the id at the top-level member `field` of a JSON object, as decode.py's id (the string's
 * UTF-8, or an integer's digits); JS_UNSURE unless the whole value is valid JSON, its top level an object with
 * that member once (and no other member whose name has an escape), a string of 1 to 1024 code points without
 * escapes or an integer of at most 18 digits (not -0). */
static int json_id_of(const uint8_t *in, Py_ssize_t n, const char *field, Py_ssize_t field_size,
                      const uint8_t **id, Py_ssize_t *id_size) {
    JScan s = {in, in + n};
    js_space(&s);
    if (s.p >= s.end || *s.p != '{') return JS_UNSURE;
    s.p++;
    js_space(&s);
    *id = NULL;
    if (s.p < s.end && *s.p == '}') return JS_UNSURE;  /* {}: no id */
    for (;;) {
        int escaped;
        Py_ssize_t chars;
        if (s.p >= s.end || *s.p != '"') return JS_UNSURE;
        const uint8_t *name = s.p + 1;
        if (js_string(&s, &escaped, &chars) || escaped) return JS_UNSURE;
        int is_field = (s.p - 1 - name == field_size && !memcmp(name, field, field_size));
        js_space(&s);
        if (s.p >= s.end || *s.p != ':') return JS_UNSURE;
        s.p++;
        js_space(&s);
        if (!is_field) {
            if (js_value(&s, 1)) return JS_UNSURE;
        } else {
            if (*id) return JS_UNSURE;  /* the field twice */
            const uint8_t *at = s.p;
            if (at < s.end && *at == '"') {
                if (js_string(&s, &escaped, &chars) || escaped || chars < 1 || chars > JS_MAX_ID_CHARS) return JS_UNSURE;
                *id = at + 1;
                *id_size = s.p - 1 - *id;
            } else if (at < s.end && (*at == '-' || (*at >= '0' && *at <= '9'))) {
                int integer;
                if (js_number(&s, &integer) || !integer) return JS_UNSURE;
                Py_ssize_t digits = s.p - at - (*at == '-');
                if (digits > JS_MAX_INT_DIGITS || (*at == '-' && at[1] == '0')) return JS_UNSURE;
                *id = at;
                *id_size = s.p - at;
            } else {
                return JS_UNSURE;  /* null, "", a float, a bool, a list, an object: decode.py's rules */
            }
        }
        js_space(&s);
        if (s.p >= s.end) return JS_UNSURE;
        if (*s.p == '}') break;
        if (*s.p != ',') return JS_UNSURE;
        s.p++;
        js_space(&s);
    }
    s.p++;
    js_space(&s);
    return (s.p == s.end && *id) ? JS_OK : JS_UNSURE;
}

/* json_id_keys(values, keys, rejected, field, max_record) -> list: for each record, records.id_key of its id
 * (BLAKE2b-64 of its UTF-8 bytes) where json_id_of vouches for it, and the record is otherwise one decode.py
 * reads to a document or rejection with that id (a value of at most max_record bytes, a key that is None or
 * valid UTF-8, nothing rejected as it was read); None for every other record, for decode.py to decode. */
static PyObject *json_id_keys(PyObject *self, PyObject *args) {
    PyObject *values, *keys, *rejected;
    const char *field;
    Py_ssize_t field_size, max_record;
    if (!PyArg_ParseTuple(args, "O!O!O!y#n", &PyList_Type, &values, &PyList_Type, &keys, &PyList_Type, &rejected,
                          &field, &field_size, &max_record))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(values);
    if (PyList_GET_SIZE(keys) != n || PyList_GET_SIZE(rejected) != n)
        return PyErr_Format(PyExc_ValueError, "json_id_keys: values, keys and rejected differ in length");
    PyObject *result = PyList_New(n);
    for (Py_ssize_t i = 0; result && i < n; i++) {
        PyObject *value = PyList_GET_ITEM(values, i), *key = PyList_GET_ITEM(keys, i), *found = Py_None;
        const uint8_t *id = NULL;
        Py_ssize_t id_size = 0;
        if (PyBytes_Check(value) && PyBytes_GET_SIZE(value) <= max_record && PyList_GET_ITEM(rejected, i) == Py_None
                && (key == Py_None || (PyBytes_Check(key)
                                       && utf8_valid((const uint8_t *)PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key))))
                && json_id_of((const uint8_t *)PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value), field, field_size,
                              &id, &id_size) == JS_OK) {
            found = PyBytes_FromStringAndSize(NULL, 8);
            if (!found) { Py_CLEAR(result); break; }
            blake2b(id, id_size, (unsigned char *)PyBytes_AS_STRING(found), 8);
        } else {
            Py_INCREF(found);
        }
        PyList_SET_ITEM(result, i, found);
    }
    return result;
}

/* consumer_records: a v2 record batch's records read as kafka-python's fetcher reads them. */

static int read_varint(const uint8_t *b, Py_ssize_t end, Py_ssize_t *pos, int64_t *out) {
    uint64_t raw = 0;
    for (int shift = 0; shift < 63; shift += 7) {  /* nine bytes at most: longer ones go to kafka-python */
        if (*pos >= end) return -1;
        uint8_t byte = b[(*pos)++];
        raw |= (uint64_t)(byte & 0x7f) << shift;
        if (!(byte & 0x80)) {
            *out = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
            return 0;
        }
    }
    return -1;
}

/* Bytes of length ``size`` at pos (None when size is -1), or -1 when the framing is off. */
static int read_field(const uint8_t *b, Py_ssize_t end, Py_ssize_t *pos, PyObject **out, int64_t *size) {
    if (read_varint(b, end, pos, size) < 0 || *size < -1 || *size > end - *pos) return -1;
    if (*size < 0) {
        Py_INCREF(Py_None);
        *out = Py_None;
        return 0;
    }
    *out = PyBytes_FromStringAndSize((const char *)b + *pos, (Py_ssize_t)*size);
    if (!*out) return -2;
    *pos += (Py_ssize_t)*size;
    return 0;
}

/* The headers of a record as kafka-python's list of (str, bytes or None), and their size as it counts it
 * (-1 for none). -1: a framing or UTF-8 problem (kafka-python's reader, and wire.py's fallback, take it). */
static int read_headers(const uint8_t *b, Py_ssize_t end, Py_ssize_t *pos, PyObject **out, int64_t *size) {
    int64_t count;
    if (read_varint(b, end, pos, &count) < 0 || count < 0 || count > end - *pos) return -1;
    PyObject *headers = PyList_New((Py_ssize_t)count);
    if (!headers) return -2;
    *size = count ? 0 : -1;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t name_size, value_size;
        if (read_varint(b, end, pos, &name_size) < 0 || name_size < 0 || name_size > end - *pos) goto off;
        PyObject *name = PyUnicode_DecodeUTF8((const char *)b + *pos, (Py_ssize_t)name_size, NULL);
        if (!name) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) goto failed;
            PyErr_Clear();
            goto off;
        }
        *pos += (Py_ssize_t)name_size;
        PyObject *value;
        int r = read_field(b, end, pos, &value, &value_size);
        if (r < 0) {
            Py_DECREF(name);
            if (r == -2) goto failed;
            goto off;
        }
        PyObject *pair = PyTuple_Pack(2, name, value);
        Py_DECREF(name);
        Py_DECREF(value);
        if (!pair) goto failed;
        PyList_SET_ITEM(headers, i, pair);
        *size += name_size + (value_size > 0 ? value_size : 0);
    }
    *out = headers;
    return 0;
off:
    Py_DECREF(headers);
    return -1;
failed:
    Py_DECREF(headers);
    return -2;
}

static PyObject *consumer_records(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos, count;
    long long base_offset, first_ts, max_ts;
    int timestamp_type;
    PyObject *topic, *partition, *leader_epoch;
    PyTypeObject *record_type;
    if (!PyArg_ParseTuple(args, "y*nnLLLiOOOO!", &view, &pos, &count, &base_offset, &first_ts, &max_ts,
                          &timestamp_type, &topic, &partition, &leader_epoch, &PyType_Type, &record_type))
        return NULL;
    if (!PyType_IsSubtype(record_type, &PyTuple_Type)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "consumer_records: the record type must be a tuple type (a namedtuple)");
        return NULL;
    }
    const uint8_t *b = view.buf;
    Py_ssize_t end = view.len;
    PyObject *records = (count >= 0 && pos >= 0 && pos <= end) ? PyList_New(0) : NULL;
    if (!records) goto off;
    Py_ssize_t bytes = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t length, attributes, ts_delta, offset_delta, key_size, value_size, headers_size;
        PyObject *key = NULL, *value = NULL, *headers = NULL;
        if (read_varint(b, end, &pos, &length) < 0) goto off;
        Py_ssize_t start = pos;
        if (read_varint(b, end, &pos, &attributes) < 0 || read_varint(b, end, &pos, &ts_delta) < 0
            || read_varint(b, end, &pos, &offset_delta) < 0)
            goto off;
        int r = read_field(b, end, &pos, &key, &key_size);
        if (r == 0) {
            r = read_field(b, end, &pos, &value, &value_size);
            if (r == 0) r = read_headers(b, end, &pos, &headers, &headers_size);
        }
        if (r == 0 && pos - start != length) r = -1;
        PyObject *record = r == 0 ? record_type->tp_alloc(record_type, 13) : NULL;
        if (!record) {
            Py_XDECREF(key);
            Py_XDECREF(value);
            Py_XDECREF(headers);
            if (r == -1) goto off;
            goto failed;
        }
        PyObject *fields[13] = {topic, partition, leader_epoch,
                                PyLong_FromLongLong(base_offset + offset_delta),
                                PyLong_FromLongLong(timestamp_type ? max_ts : first_ts + ts_delta),
                                PyLong_FromLong(timestamp_type), key, value, headers, Py_None,
                                PyLong_FromLongLong(key_size), PyLong_FromLongLong(value_size),
                                PyLong_FromLongLong(headers_size)};
        Py_INCREF(topic);
        Py_INCREF(partition);
        Py_INCREF(leader_epoch);
        Py_INCREF(Py_None);
        int missing = 0;
        for (int f = 0; f < 13; f++) {
            if (!fields[f]) missing = 1;
            PyTuple_SET_ITEM(record, f, fields[f]);  /* NULL slots are legal in a tuple being dropped */
        }
        if (missing || PyList_Append(records, record) < 0) {
            Py_DECREF(record);
            goto failed;
        }
        Py_DECREF(record);
        bytes += (Py_ssize_t)length;
    }
    if (pos != end) goto off;  /* bytes after the last record: kafka-python raises its own error */
    PyBuffer_Release(&view);
    PyObject *result = Py_BuildValue("(Nn)", records, bytes);
    return result;
off:
    PyBuffer_Release(&view);
    Py_XDECREF(records);
    Py_RETURN_NONE;
failed:
    PyBuffer_Release(&view);
    Py_XDECREF(records);
    return NULL;
}

/* ===== Band evidence: the recent mirror's levels searched in one call, found runs merged (hot36) =====
 *
 * level_rows(levels, asked, bits, shift) -> (slots bytearray, serials bytearray)
 *     The entries of the recent mirror's levels (mirror.RecentMirror: a list of (uint64 slots, int64
 *     serials) pairs, each sorted by slot, oldest level first) under the sorted band slots asked (repeats
 *     allowed, each searched once), leaving out those whose presence bit (key_bits_test's) is clear:
 *     slot by slot, each level's entries in turn, so that with levels whose serials ascend within a slot
 *     and from level to level the result is sorted by slot, then serial.
 *
 * earliest_runs(runs, limit) -> (keys bytearray, serials bytearray) or None
 *     candidates.earliest_of_each_key of the runs' entries together ((uint64 keys, int64 serials) pairs):
 *     sorted by key, then serial, each key keeping its first limit; by merging the runs, each of which
 *     must be so sorted already (None when one is not: the caller sorts). */

typedef struct { int64_t *serials; uint64_t *keys; Py_ssize_t size, room; } Entries;

static int entries_add(Entries *e, uint64_t key, int64_t serial) {
    if (e->size == e->room) {
        Py_ssize_t room = e->room ? 2 * e->room : 256;
        uint64_t *keys = realloc(e->keys, (size_t)room * 8);
        if (!keys) { PyErr_NoMemory(); return -1; }
        e->keys = keys;
        int64_t *serials = realloc(e->serials, (size_t)room * 8);
        if (!serials) { PyErr_NoMemory(); return -1; }
        e->serials = serials;
        e->room = room;
    }
    e->keys[e->size] = key;
    e->serials[e->size++] = serial;
    return 0;
}

static PyObject *entries_result(Entries *e) {
    PyObject *keys = PyByteArray_FromStringAndSize((const char *)e->keys, e->size * 8);
    PyObject *serials = keys ? PyByteArray_FromStringAndSize((const char *)e->serials, e->size * 8) : NULL;
    if (!serials) { Py_XDECREF(keys); return NULL; }
    return Py_BuildValue("NN", keys, serials);
}

/* The (keys, serials) pairs of a list, viewed: n of them, or -1 with an error set (views released). */
static Py_ssize_t entry_pairs(PyObject *list, Py_buffer **views, const char *what) {
    if (!PyList_Check(list)) { PyErr_Format(PyExc_TypeError, "%s: a list of (keys, serials)", what); return -1; }
    Py_ssize_t n = PyList_GET_SIZE(list), got = 0;
    *views = calloc((size_t)(2 * n + 1), sizeof(Py_buffer));
    if (!*views) { PyErr_NoMemory(); return -1; }
    for (; got < n; got++) {
        PyObject *pair = PyList_GET_ITEM(list, got);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_Format(PyExc_TypeError, "%s: a list of (keys, serials)", what);
            break;
        }
        if (get_buffer(PyTuple_GET_ITEM(pair, 0), &(*views)[2 * got], 8, 0, "keys") < 0) break;
        if (get_buffer(PyTuple_GET_ITEM(pair, 1), &(*views)[2 * got + 1], 8, 0, "serials") < 0) {
            PyBuffer_Release(&(*views)[2 * got]);
            break;
        }
        if ((*views)[2 * got].len != (*views)[2 * got + 1].len) {
            PyErr_Format(PyExc_ValueError, "%s: keys and serials differ in length", what);
            PyBuffer_Release(&(*views)[2 * got]);
            PyBuffer_Release(&(*views)[2 * got + 1]);
            break;
        }
    }
    if (got == n) return n;
    for (Py_ssize_t i = 0; i < 2 * got; i++) PyBuffer_Release(&(*views)[i]);
    free(*views);
    *views = NULL;
    return -1;
}

static void entry_pairs_release(Py_buffer *views, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < 2 * n; i++) PyBuffer_Release(&views[i]);
    free(views);
}

static PyObject *level_rows(PyObject *self, PyObject *args) {
    PyObject *o_levels, *o_asked, *o_bits;
    int shift;
    if (!PyArg_ParseTuple(args, "OOOi", &o_levels, &o_asked, &o_bits, &shift)) return NULL;
    Py_buffer *levels = NULL, av, bv;
    Py_ssize_t k = entry_pairs(o_levels, &levels, "level_rows");
    if (k < 0) return NULL;
    if (get_buffer(o_asked, &av, 8, 0, "asked") < 0) { entry_pairs_release(levels, k); return NULL; }
    if (get_buffer(o_bits, &bv, 1, 0, "bits") < 0) {
        PyBuffer_Release(&av);
        entry_pairs_release(levels, k);
        return NULL;
    }
    Entries out = {NULL, NULL, 0, 0};
    PyObject *result = NULL;
    Py_ssize_t *from = calloc((size_t)k + 1, sizeof(Py_ssize_t));
    if (!from) { PyErr_NoMemory(); goto done; }
    const uint64_t *asked = av.buf, mask = (uint64_t)bv.len * 8 - 1;
    const uint8_t *map = bv.buf;
    Py_ssize_t a = av.len / 8;
    if (bv.len == 0 || (bv.len & (bv.len - 1)) || shift < 0 || shift > 63) {
        PyErr_SetString(PyExc_ValueError, "level_rows: the presence bits are not a power of two bytes");
        goto done;
    }
    for (Py_ssize_t q = 0; q < a; q++) {
        uint64_t want = asked[q], number = (want >> shift) & mask;
        if ((q > 0 && want == asked[q - 1]) || !((map[number >> 3] >> (number & 7)) & 1)) continue;
        for (Py_ssize_t l = 0; l < k; l++) {
            const uint64_t *keys = levels[2 * l].buf;
            const int64_t *serials = levels[2 * l + 1].buf;
            Py_ssize_t n = levels[2 * l].len / 8, at = from[l];
            if (at >= n) continue;
            at = lower_bound_from(keys, n, want, at);
            for (; at < n && keys[at] == want; at++)
                if (entries_add(&out, want, serials[at]) < 0) goto done;
            from[l] = at;
        }
    }
    result = entries_result(&out);
done:
    free(from); free(out.keys); free(out.serials);
    PyBuffer_Release(&bv);
    PyBuffer_Release(&av);
    entry_pairs_release(levels, k);
    return result;
}

/* Whether entries are sorted by key, then serial. */
static int entries_sorted(const uint64_t *keys, const int64_t *serials, Py_ssize_t n) {
    for (Py_ssize_t i = 1; i < n; i++)
        if (keys[i] < keys[i - 1] || (keys[i] == keys[i - 1] && serials[i] < serials[i - 1])) return 0;
    return 1;
}

static PyObject *earliest_runs(PyObject *self, PyObject *args) {
    PyObject *o_runs;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "On", &o_runs, &limit)) return NULL;
    Py_buffer *runs = NULL;
    Py_ssize_t k = entry_pairs(o_runs, &runs, "earliest_runs");
    if (k < 0) return NULL;
    Entries out = {NULL, NULL, 0, 0};
    PyObject *result = NULL;
    Py_ssize_t *at = calloc((size_t)k + 1, sizeof(Py_ssize_t));
    if (!at) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t r = 0; r < k; r++)
        if (!entries_sorted(runs[2 * r].buf, runs[2 * r + 1].buf, runs[2 * r].len / 8)) {
            result = Py_None;
            Py_INCREF(result);
            goto done;
        }
    Py_ssize_t kept = 0;
    for (;;) {
        Py_ssize_t best = -1;
        uint64_t key = 0;
        int64_t serial = 0;
        for (Py_ssize_t r = 0; r < k; r++) {
            if (at[r] >= runs[2 * r].len / 8) continue;
            uint64_t rk = ((const uint64_t *)runs[2 * r].buf)[at[r]];
            int64_t rs = ((const int64_t *)runs[2 * r + 1].buf)[at[r]];
            if (best < 0 || rk < key || (rk == key && rs < serial)) { best = r; key = rk; serial = rs; }
        }
        if (best < 0) break;
        at[best]++;
        kept = out.size && out.keys[out.size - 1] == key ? kept + 1 : 1;
        if (kept <= limit && entries_add(&out, key, serial) < 0) goto done;
    }
    result = entries_result(&out);
done:
    free(at); free(out.keys); free(out.serials);
    entry_pairs_release(runs, k);
    return result;
}

/* ===== end of the band evidence block (hot36) ===== */
/* ---- Site learning's lookups and merges (templates.GrowingSet): a large sorted table found through its
 * buckets, a page's few values merged into it ---- */

/* starts[j] = the first place of sorted t[0:m] whose value's top bits (value >> shift) are j or more, for every
 * j up to 2**(32 - shift) (that last one: m). */
static void fill_bucket_starts(const uint32_t *t, Py_ssize_t m, int shift, uint32_t *starts) {
    uint64_t buckets = (uint64_t)1 << (32 - shift);
    Py_ssize_t at = 0;
    for (uint64_t j = 0; j < buckets; j++) {
        while (at < m && (uint64_t)(t[at] >> shift) < j) at++;
        starts[j] = (uint32_t)at;
    }
    starts[buckets] = (uint32_t)m;
}

#define BUCKET_OF(key, shift) ((shift) == 32 ? 0 : (key) >> (shift))
#define STARTS_AHEAD 16 /* values ahead whose bucket start is fetched, */
#define VALUES_AHEAD 8  /* and whose bucket's first values are (read from that start, fetched before) */

/* o[i] |= whether v[i] is in sorted t, found through its bucket (a few values, walked in order). A site's table
 * is seldom in the cache when its next page comes: each value's two reads miss, so those of the values ahead
 * are asked for early and the misses overlap. */
static void mark_bucketed(const uint32_t *v, Py_ssize_t n, const uint32_t *t, const uint32_t *starts, int shift,
                          uint8_t *o) {
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + STARTS_AHEAD < n) __builtin_prefetch(&starts[BUCKET_OF(v[i + STARTS_AHEAD], shift)]);
        if (i + VALUES_AHEAD < n) __builtin_prefetch(&t[starts[BUCKET_OF(v[i + VALUES_AHEAD], shift)]]);
        uint32_t key = v[i], j = BUCKET_OF(key, shift);
        uint32_t at = starts[j], end = starts[j + 1];
        while (at < end && t[at] < key) at++;
        o[i] |= at < end && t[at] == key;
    }
}

static int bucket_shift_ok(int shift, Py_ssize_t starts_len) {
    if (shift < 1 || shift > 32 || starts_len != (((Py_ssize_t)1 << (32 - shift)) + 1) * 4) {
        PyErr_SetString(PyExc_ValueError, "bucket starts: shift in 1..32 and 2**(32 - shift) + 1 starts");
        return 0;
    }
    return 1;
}

static PyObject *bucket_starts(PyObject *self, PyObject *args) {
    PyObject *o_table, *o_out;
    int shift;
    if (!PyArg_ParseTuple(args, "OiO", &o_table, &shift, &o_out)) return NULL;
    Py_buffer table, out;
    if (get_buffer(o_table, &table, 4, 0, "table") < 0) return NULL;
    if (get_buffer(o_out, &out, 4, 1, "out") < 0) { PyBuffer_Release(&table); return NULL; }
    if (bucket_shift_ok(shift, out.len)) fill_bucket_starts(table.buf, table.len / 4, shift, out.buf);
    PyBuffer_Release(&out);
    PyBuffer_Release(&table);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

static PyObject *growing_member(PyObject *self, PyObject *args) {
    PyObject *objects[5];
    int shift;
    if (!PyArg_ParseTuple(args, "OOOiOO", &objects[0], &objects[1], &objects[2], &shift, &objects[3], &objects[4]))
        return NULL;
    static const char *names[5] = {"values", "main", "starts", "recent", "out"};
    Py_buffer views[5];
    int got = 0;
    for (; got < 5; got++)
        if (get_buffer(objects[got], &views[got], got == 4 ? 1 : 4, got == 4, names[got]) < 0) break;
    if (got == 5 && bucket_shift_ok(shift, views[2].len)) {
        Py_ssize_t n = views[0].len / 4;
        if (views[4].len != n) {
            PyErr_SetString(PyExc_ValueError, "growing_member: out must have one byte a value");
        } else {
            memset(views[4].buf, 0, n);
            mark_bucketed(views[0].buf, n, views[1].buf, views[2].buf, shift, views[4].buf);
            mark_members(views[0].buf, n, views[3].buf, views[3].len / 4, views[4].buf);
        }
    }
    while (got > 0) PyBuffer_Release(&views[--got]);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* The values of v[0:n] (one byte a value in mark) whose mark is want, in order, into o; how many. */
static Py_ssize_t gather_marked(const uint32_t *v, Py_ssize_t n, const uint8_t *mark, uint8_t want, uint32_t *o) {
    Py_ssize_t w = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        o[w] = v[i];
        w += mark[i] == want;
    }
    return w;
}

/* A GrowingSet as the kernel reads it: its main part, that part's bucket starts and shift, its recent part. */
typedef struct {
    Py_buffer main, starts, recent;
    int shift;
} growing_view;

static int growing_views(PyObject *main, PyObject *starts, int shift, PyObject *recent, growing_view *g) {
    if (get_buffer(main, &g->main, 4, 0, "main") < 0) return -1;
    if (get_buffer(starts, &g->starts, 4, 0, "starts") < 0) goto fail_main;
    if (get_buffer(recent, &g->recent, 4, 0, "recent") < 0) goto fail_starts;
    g->shift = shift;
    if (bucket_shift_ok(shift, g->starts.len)) return 0;
    PyBuffer_Release(&g->recent);
fail_starts:
    PyBuffer_Release(&g->starts);
fail_main:
    PyBuffer_Release(&g->main);
    return -1;
}

static void growing_release(growing_view *g) {
    PyBuffer_Release(&g->recent);
    PyBuffer_Release(&g->starts);
    PyBuffer_Release(&g->main);
}

static void mark_growing(const uint32_t *v, Py_ssize_t n, const growing_view *g, uint8_t *o) {
    mark_bucketed(v, n, g->main.buf, g->starts.buf, g->shift, o);
    mark_members(v, n, g->recent.buf, g->recent.len / 4, o);
}

static PyObject *new_and_again(PyObject *self, PyObject *args) {
    PyObject *o_page, *o_fresh, *o_again, *set[6];
    int shifts[2];
    if (!PyArg_ParseTuple(args, "OOOiOOOiOOO", &o_page, &set[0], &set[1], &shifts[0], &set[2], &set[3], &set[4],
                          &shifts[1], &set[5], &o_fresh, &o_again))
        return NULL;
    Py_buffer page, fresh, again;
    growing_view seen, repeated;
    Py_ssize_t n_fresh = -1, n_again = -1;
    if (get_buffer(o_page, &page, 4, 0, "page") < 0) return NULL;
    if (get_buffer(o_fresh, &fresh, 4, 1, "fresh") < 0) goto release_page;
    if (get_buffer(o_again, &again, 4, 1, "again") < 0) goto release_fresh;
    if (growing_views(set[0], set[1], shifts[0], set[2], &seen) < 0) goto release_again;
    if (growing_views(set[3], set[4], shifts[1], set[5], &repeated) < 0) goto release_seen;
    Py_ssize_t n = page.len / 4;
    uint8_t *mark = fresh.len < page.len || again.len < page.len ? NULL : calloc(n ? n : 1, 1);
    if (!mark) {
        if (fresh.len < page.len || again.len < page.len)
            PyErr_SetString(PyExc_ValueError, "new_and_again: fresh and again must have room for the page");
        else
            PyErr_NoMemory();
    } else {
        const uint32_t *v = page.buf;
        mark_growing(v, n, &seen, mark);
        n_fresh = gather_marked(v, n, mark, 0, fresh.buf);
        Py_ssize_t known = gather_marked(v, n, mark, 1, again.buf);
        memset(mark, 0, n);
        mark_growing(again.buf, known, &repeated, mark);
        n_again = gather_marked(again.buf, known, mark, 0, again.buf);
        free(mark);
    }
    growing_release(&repeated);
release_seen:
    growing_release(&seen);
release_again:
    PyBuffer_Release(&again);
release_fresh:
    PyBuffer_Release(&fresh);
release_page:
    PyBuffer_Release(&page);
    if (PyErr_Occurred()) return NULL;
    return Py_BuildValue("(nn)", n_fresh, n_again);
}

/* ---- end of site learning's lookups and merges ---- */

/* ---- a site's seen and repeated shingles as one open-addressed table (templates.RepeatTable) ---- */

#define HASHED_AHEAD 8  /* values ahead whose slot is fetched early */
#define NOT_REPEATED 0xFFFFFFFFu  /* the stamp of a value seen on one page */

typedef struct {
    Py_buffer slots, meta;
    uint32_t *t, *m;  /* t[2 * at]: the key of slot at, t[2 * at + 1]: its stamp (one cache line for both) */
    uint32_t mask;
    int shift;
} hashed_view;

static inline uint32_t hashed_slot(uint32_t v, int shift) {
    return shift >= 32 ? 0 : (uint32_t)(v * 0x9E3779B1u) >> shift;
}

static int hashed_views(PyObject *slots, PyObject *meta, hashed_view *h) {
    if (get_buffer(slots, &h->slots, 8, 1, "slots") < 0) return -1;
    if (get_buffer(meta, &h->meta, 4, 1, "meta") < 0) goto fail_slots;
    Py_ssize_t n = h->slots.len / 8;
    if (n < 2 || (n & (n - 1)) || n > ((Py_ssize_t)1 << 31) || h->meta.len < 16) {
        PyErr_SetString(PyExc_ValueError, "hashed table: slots (key, stamp) a power of two of them, meta 4");
        PyBuffer_Release(&h->meta);
        goto fail_slots;
    }
    h->t = h->slots.buf;
    h->m = h->meta.buf;
    h->mask = (uint32_t)(n - 1);
    int bits = 0;
    while (((Py_ssize_t)1 << bits) < n) bits++;
    h->shift = 32 - bits;
    return 0;
fail_slots:
    PyBuffer_Release(&h->slots);
    return -1;
}

static void hashed_release(hashed_view *h) {
    PyBuffer_Release(&h->meta);
    PyBuffer_Release(&h->slots);
}

/* Where v (not 0) is in the table, or the empty slot where it would go (the caller keeps a free slot). */
static inline uint32_t hashed_find(const hashed_view *h, uint32_t v) {
    uint32_t at = hashed_slot(v, h->shift);
    while (h->t[2 * at] != v && h->t[2 * at] != 0) at = (at + 1) & h->mask;
    return at;
}

static inline void hashed_prefetch(const hashed_view *h, const uint32_t *v, Py_ssize_t i, Py_ssize_t n) {
    if (i + HASHED_AHEAD < n) __builtin_prefetch(&h->t[2 * hashed_slot(v[i + HASHED_AHEAD], h->shift)]);
}

/* v's stamp (where it is, into *at: the slot, or the mask + 1 for 0), or 0 with *held = 0 when absent. */
static inline uint32_t hashed_stamp(const hashed_view *h, uint32_t v, uint32_t *at, int *held) {
    if (v == 0) {
        *at = h->mask + 1;
        *held = h->m[1] != 0;
        return h->m[2];
    }
    *at = hashed_find(h, v);
    *held = h->t[2 * *at] != 0;
    return h->t[2 * *at + 1];
}

/* Put v with stamp at its place (from hashed_stamp), counting values held and repeated ones. */
static inline void hashed_set(hashed_view *h, uint32_t v, uint32_t at, int held, uint32_t old, uint32_t stamp) {
    h->m[0] += !held;
    h->m[3] += (!held || old == NOT_REPEATED) && stamp != NOT_REPEATED;
    h->m[3] -= held && old != NOT_REPEATED && stamp == NOT_REPEATED;
    if (at > h->mask) {
        h->m[1] = 1;
        h->m[2] = stamp;
    } else {
        h->t[2 * at] = v;
        h->t[2 * at + 1] = stamp;
    }
}

/* Whether the table has room for extra more values (at most two thirds full after them). */
static int hashed_room(const hashed_view *h, Py_ssize_t extra) {
    if (3 * ((Py_ssize_t)h->m[0] + extra) <= 2 * ((Py_ssize_t)h->mask + 1)) return 1;
    PyErr_SetString(PyExc_ValueError, "hashed table: no room for the values (grow it first)");
    return 0;
}

static PyObject *hashed_add(PyObject *self, PyObject *args) {
    PyObject *o_values, *o_stamps, *o_slots, *o_meta;
    if (!PyArg_ParseTuple(args, "OOOO", &o_values, &o_stamps, &o_slots, &o_meta)) return NULL;
    Py_buffer values, stamps;
    hashed_view h;
    if (get_buffer(o_values, &values, 4, 0, "values") < 0) return NULL;
    if (get_buffer(o_stamps, &stamps, 4, 0, "stamps") < 0) goto release_values;
    if (hashed_views(o_slots, o_meta, &h) < 0) goto release_stamps;
    Py_ssize_t n = values.len / 4;
    if (stamps.len != values.len) {
        PyErr_SetString(PyExc_ValueError, "hashed_add: a stamp a value");
    } else {
        const uint32_t *v = values.buf, *s = stamps.buf;
        uint32_t at;
        int held;
        for (Py_ssize_t i = 0; i < n; i++) {
            hashed_prefetch(&h, v, i, n);
            uint32_t old = hashed_stamp(&h, v[i], &at, &held);
            if (!held && !hashed_room(&h, 1)) break;  /* a value held already takes no room */
            hashed_set(&h, v[i], at, held, old, s[i]);
        }
    }
    hashed_release(&h);
release_stamps:
    PyBuffer_Release(&stamps);
release_values:
    PyBuffer_Release(&values);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* Every value of a table (old_slots) put into a larger empty one (new_slots, new_meta: zeros), stamps and all:
 * the old slots read in order, each key's new slot fetched early, an empty slot found without comparing keys
 * (they are distinct); the counts and the value 0 (held in meta) are the caller's to copy. */
static PyObject *hashed_moved(PyObject *self, PyObject *args) {
    PyObject *o_old, *o_slots, *o_meta;
    if (!PyArg_ParseTuple(args, "OOO", &o_old, &o_slots, &o_meta)) return NULL;
    Py_buffer old;
    hashed_view h;
    if (get_buffer(o_old, &old, 8, 0, "old") < 0) return NULL;
    if (hashed_views(o_slots, o_meta, &h) < 0) goto release_old;
    const uint32_t *t = old.buf;
    Py_ssize_t n = old.len / 8, held = 0;
    for (Py_ssize_t i = 0; i < n; i++) held += t[2 * i] != 0;
    if (3 * held > 2 * ((Py_ssize_t)h.mask + 1)) {
        PyErr_SetString(PyExc_ValueError, "hashed_moved: no room for the values");
    } else {
        for (Py_ssize_t i = 0; i < n; i++) {
            if (i + HASHED_AHEAD < n && t[2 * (i + HASHED_AHEAD)])
                __builtin_prefetch(&h.t[2 * hashed_slot(t[2 * (i + HASHED_AHEAD)], h.shift)], 1);
            uint32_t v = t[2 * i];
            if (!v) continue;
            uint32_t at = hashed_slot(v, h.shift);
            while (h.t[2 * at]) at = (at + 1) & h.mask;
            h.t[2 * at] = v;
            h.t[2 * at + 1] = t[2 * i + 1];
        }
    }
    hashed_release(&h);
release_old:
    PyBuffer_Release(&old);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

static PyObject *hashed_count(PyObject *self, PyObject *args) {
    PyObject *o_page, *o_slots, *o_meta, *o_fresh, *o_again;
    int takes;
    unsigned int stamp;
    if (!PyArg_ParseTuple(args, "OOOpIOO", &o_page, &o_slots, &o_meta, &takes, &stamp, &o_fresh, &o_again))
        return NULL;
    Py_buffer page, fresh, again;
    hashed_view h;
    Py_ssize_t n_fresh = -1, n_again = -1;
    if (get_buffer(o_page, &page, 4, 0, "page") < 0) return NULL;
    if (get_buffer(o_fresh, &fresh, 4, 1, "fresh") < 0) goto release_page;
    if (get_buffer(o_again, &again, 4, 1, "again") < 0) goto release_fresh;
    if (hashed_views(o_slots, o_meta, &h) < 0) goto release_again;
    Py_ssize_t n = page.len / 4;
    if (fresh.len < page.len || again.len < page.len || stamp == NOT_REPEATED) {
        PyErr_SetString(PyExc_ValueError, "hashed_count: fresh and again with room for the page, a stamp below 2**32-1");
    } else if (hashed_room(&h, takes ? n : 0)) {
        const uint32_t *v = page.buf;
        uint32_t *f = fresh.buf, *a = again.buf, at;
        int held;
        n_fresh = n_again = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            hashed_prefetch(&h, v, i, n);
            uint32_t old = hashed_stamp(&h, v[i], &at, &held);
            if (!held) {
                f[n_fresh++] = v[i];
                if (takes) hashed_set(&h, v[i], at, held, old, NOT_REPEATED);
            } else if (old == NOT_REPEATED) {
                a[n_again++] = v[i];
                hashed_set(&h, v[i], at, held, old, stamp);
            }
        }
    }
    hashed_release(&h);
release_again:
    PyBuffer_Release(&again);
release_fresh:
    PyBuffer_Release(&fresh);
release_page:
    PyBuffer_Release(&page);
    if (PyErr_Occurred()) return NULL;
    return Py_BuildValue("(nn)", n_fresh, n_again);
}

static PyObject *hashed_member(PyObject *self, PyObject *args) {
    PyObject *o_values, *o_slots, *o_meta, *o_out;
    unsigned int stamp;
    if (!PyArg_ParseTuple(args, "OOOIO", &o_values, &o_slots, &o_meta, &stamp, &o_out)) return NULL;
    Py_buffer values, out;
    hashed_view h;
    if (get_buffer(o_values, &values, 4, 0, "values") < 0) return NULL;
    if (get_buffer(o_out, &out, 1, 1, "out") < 0) goto release_values;
    if (hashed_views(o_slots, o_meta, &h) < 0) goto release_out;
    Py_ssize_t n = values.len / 4;
    if (out.len != n || stamp == NOT_REPEATED) {
        PyErr_SetString(PyExc_ValueError, "hashed_member: out one byte a value, a stamp below 2**32-1");
    } else {
        const uint32_t *v = values.buf;
        uint8_t *o = out.buf;
        uint32_t at;
        int held;
        for (Py_ssize_t i = 0; i < n; i++) {
            hashed_prefetch(&h, v, i, n);
            uint32_t found = hashed_stamp(&h, v[i], &at, &held);
            o[i] = held && found <= stamp;
        }
    }
    hashed_release(&h);
release_out:
    PyBuffer_Release(&out);
release_values:
    PyBuffer_Release(&values);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* A batch's new pages counted in turn, each in its site's table (templates.count_new_pages): page p is
 * values[bounds[6p]:bounds[6p + 1]] (sorted uint32), of the site owners[p] (tables[owners[p]]: its (slots, meta)),
 * its site's template templates[bounds[6p + 2]:bounds[6p + 3]] and the shared one
 * templates[bounds[6p + 4]:bounds[6p + 5]] as they stood before it (sorted). Its counted part (not in the
 * template) and its kept part (in neither) as sorted_without_each finds them, then hashed_count of the counted
 * part stamped stamps[p], its fresh values put in while seen[owners[p]] (the values the site's seen holds and its
 * earlier pages added; moved on here) is below max_seen. Each page's parts are appended to counted, kept, fresh
 * and again (room for every value of the pages); sizes[p] (int64, 6 a page) is (counted, kept, fresh, again, how
 * many of the kept values are fresh, whether the site took the fresh values). Before a page whose fresh values
 * would leave its table more than two thirds full, grow(owner, values) is called, as RepeatTable.count grows a
 * table, and returns the site's new (slots, meta). Returns how many pages were counted. */
static PyObject *hashed_count_pages(PyObject *self, PyObject *args) {
    PyObject *o[12], *o_tables, *grow;
    Py_ssize_t max_seen;
    if (!PyArg_ParseTuple(args, "OOOOOOOOnOOOOO", &o[0], &o[1], &o[2], &o_tables, &grow, &o[3], &o[4], &o[5],
                          &max_seen, &o[6], &o[7], &o[8], &o[9], &o[10]))
        return NULL;
    /* o: values, templates, bounds, owners, stamps, seen, counted, kept, fresh, again, sizes */
    static const char *names[11] = {"values", "templates", "bounds", "owners", "stamps", "seen",
                                    "counted", "kept", "fresh", "again", "sizes"};
    static const Py_ssize_t widths[11] = {4, 4, 8, 4, 4, 8, 4, 4, 4, 4, 8};
    Py_buffer views[11];
    hashed_view *tables = NULL;
    Py_ssize_t n_tables = 0, viewed = 0, done = -1;
    int got = 0;
    uint8_t *marks = NULL;
    for (; got < 11; got++)
        if (get_buffer(o[got], &views[got], widths[got], got >= 5, names[got]) < 0) goto release;
    if (!PyTuple_Check(o_tables)) {
        PyErr_SetString(PyExc_TypeError, "hashed_count_pages: tables must be a tuple of (slots, meta)");
        goto release;
    }
    n_tables = PyTuple_GET_SIZE(o_tables);
    tables = calloc(n_tables ? (size_t)n_tables : 1, sizeof(hashed_view));
    if (!tables) {
        PyErr_NoMemory();
        goto release;
    }
    for (; viewed < n_tables; viewed++) {
        PyObject *pair = PyTuple_GET_ITEM(o_tables, viewed);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "hashed_count_pages: tables must be a tuple of (slots, meta)");
            goto release;
        }
        if (hashed_views(PyTuple_GET_ITEM(pair, 0), PyTuple_GET_ITEM(pair, 1), &tables[viewed]) < 0) goto release;
    }
    const uint32_t *v = views[0].buf, *tpl = views[1].buf, *stamps = views[4].buf;
    const int64_t *bounds = views[2].buf;
    const int32_t *owners = views[3].buf;
    int64_t *seen = views[5].buf;
    Py_ssize_t pages = views[2].len / 48, n_values = views[0].len / 4, n_templates = views[1].len / 4;
    Py_ssize_t longest = 0, total = 0;
    if (views[2].len % 48 || views[3].len / 4 != pages || views[4].len / 4 != pages || views[5].len / 8 != n_tables ||
        views[10].len / 8 != 6 * pages) {
        PyErr_SetString(PyExc_ValueError,
                        "hashed_count_pages: six bounds, an owner, a stamp and six sizes a page; a seen a table");
        goto release;
    }
    for (Py_ssize_t p = 0; p < pages; p++) {
        const int64_t *b = bounds + 6 * p;
        if (b[0] < 0 || b[1] < b[0] || b[1] > n_values || b[2] < 0 || b[3] < b[2] || b[3] > n_templates ||
            b[4] < 0 || b[5] < b[4] || b[5] > n_templates || owners[p] < 0 || owners[p] >= n_tables ||
            stamps[p] == NOT_REPEATED) {
            PyErr_SetString(PyExc_ValueError,
                            "hashed_count_pages: bounds outside the values or templates, an owner past the tables, or a stamp of 2**32-1");
            goto release;
        }
        total += b[1] - b[0];
        if (b[1] - b[0] > longest) longest = b[1] - b[0];
    }
    for (int k = 6; k <= 9; k++) {
        if (views[k].len / 4 < total) {
            PyErr_SetString(PyExc_ValueError, "hashed_count_pages: counted, kept, fresh and again need room for every value");
            goto release;
        }
    }
    marks = calloc(longest ? 2 * (size_t)longest : 1, 1);
    if (!marks) {
        PyErr_NoMemory();
        goto release;
    }
    uint32_t *counted = views[6].buf, *kept = views[7].buf, *fresh = views[8].buf, *again = views[9].buf;
    int64_t *sizes = views[10].buf;
    Py_ssize_t w_counted = 0, w_kept = 0, w_fresh = 0, w_again = 0;
    for (done = 0; done < pages; done++) {
        const int64_t *b = bounds + 6 * done;
        const uint32_t *page = v + b[0];
        Py_ssize_t n = b[1] - b[0];
        uint8_t *templated = marks, *either = marks + n;
        memset(marks, 0, 2 * (size_t)n);
        mark_members(page, n, tpl + b[2], b[3] - b[2], templated);
        mark_members(page, n, tpl + b[4], b[5] - b[4], either);
        uint32_t *c = counted + w_counted, *k = kept + w_kept;
        Py_ssize_t n_counted = 0, n_kept = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            uint8_t shared = either[i];
            c[n_counted] = page[i];
            either[n_counted] = shared;  /* n_counted <= i: the counted values' marks, in their order */
            n_counted += !templated[i];
            k[n_kept] = page[i];
            n_kept += !(templated[i] | shared);
        }
        hashed_view *h = &tables[owners[done]];
        int64_t *site_seen = &seen[owners[done]];
        int takes = *site_seen < max_seen;
        if (takes && 3 * ((Py_ssize_t)h->m[0] + n_counted) > 2 * ((Py_ssize_t)h->mask + 1)) {
            PyObject *grown = PyObject_CallFunction(grow, "in", owners[done], (Py_ssize_t)h->m[0] + n_counted);
            if (!grown) goto release;
            hashed_release(h);  /* a released view is released again as a no-op */
            if (!PyTuple_Check(grown) || PyTuple_GET_SIZE(grown) != 2) {
                PyErr_SetString(PyExc_TypeError, "hashed_count_pages: grow must return (slots, meta)");
            } else if (hashed_views(PyTuple_GET_ITEM(grown, 0), PyTuple_GET_ITEM(grown, 1), h) == 0 &&
                       3 * ((Py_ssize_t)h->m[0] + n_counted) > 2 * ((Py_ssize_t)h->mask + 1)) {
                PyErr_SetString(PyExc_ValueError, "hashed_count_pages: grow left no room for the page");
            }
            Py_DECREF(grown);
            if (PyErr_Occurred()) goto release;
        }
        int64_t *size = sizes + 6 * done;
        size[0] = n_counted;
        uint32_t *f = fresh + w_fresh, *a = again + w_again, at;
        Py_ssize_t n_fresh = 0, n_again = 0, kept_fresh = 0;
        int held;
        for (Py_ssize_t i = 0; i < n_counted; i++) {
            hashed_prefetch(h, c, i, n_counted);
            uint32_t old = hashed_stamp(h, c[i], &at, &held);
            if (!held) {
                f[n_fresh++] = c[i];
                kept_fresh += !either[i];
                if (takes) hashed_set(h, c[i], at, held, old, NOT_REPEATED);
            } else if (old == NOT_REPEATED) {
                a[n_again++] = c[i];
                hashed_set(h, c[i], at, held, old, stamps[done]);
            }
        }
        if (takes) *site_seen += n_fresh;
        size[1] = n_kept;
        size[2] = n_fresh;
        size[3] = n_again;
        size[4] = kept_fresh;
        size[5] = takes;
        w_counted += n_counted;
        w_kept += n_kept;
        w_fresh += n_fresh;
        w_again += n_again;
    }
release:
    free(marks);
    while (viewed > 0) hashed_release(&tables[--viewed]);
    free(tables);
    while (got > 0) PyBuffer_Release(&views[--got]);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromSsize_t(done);
}

/* One value of the cursor (value()) compared with a bound: 1 past it, 0 within, -1 an error (a value not
 * of value_width bytes). Its bytes are appended to out after key (key_width bytes) when within. */
static int walked_value(PyObject *value, const char *key, Py_ssize_t key_width, const char *last,
                        Py_ssize_t value_width, char **out, Py_ssize_t *used, Py_ssize_t *room) {
    PyObject *stored = PyObject_CallNoArgs(value);
    if (!stored) return -1;
    Py_buffer view;
    if (PyObject_GetBuffer(stored, &view, PyBUF_SIMPLE) < 0) { Py_DECREF(stored); return -1; }
    int past = 0;
    if (view.len != value_width) {
        PyErr_Format(PyExc_ValueError, "stored_walk: a stored value of %zd bytes, not %zd", view.len, value_width);
        past = -1;
    } else if (memcmp(view.buf, last, value_width) > 0) {
        past = 1;
    } else {
        Py_ssize_t row = key_width + value_width;
        if (*used + row > *room) {
            Py_ssize_t grown = 2 * *room + row;
            char *bigger = PyMem_Realloc(*out, grown);
            if (!bigger) { PyErr_NoMemory(); past = -1; }
            else { *out = bigger; *room = grown; }
        }
        if (past == 0) {
            memcpy(*out + *used, key, key_width);
            memcpy(*out + *used + key_width, view.buf, value_width);
            *used += row;
        }
    }
    PyBuffer_Release(&view);
    Py_DECREF(stored);
    return past;
}

/* Whether a cursor method's answer is true: 1, 0, or -1 with an exception (none on the answer itself). */
static int called_true(PyObject *answer) {
    if (!answer) return -1;
    int truth = PyObject_IsTrue(answer);
    Py_DECREF(answer);
    return truth;
}

static PyObject *stored_walk(PyObject *self, PyObject *args) {
    PyObject *seek, *value, *next_dup, *o_buckets, *o_firsts, *o_lasts;
    Py_ssize_t key_width, value_width;
    if (!PyArg_ParseTuple(args, "OOOOOOnn", &seek, &value, &next_dup, &o_buckets, &o_firsts, &o_lasts, &key_width,
                          &value_width)) return NULL;
    if (key_width < 1 || value_width < 1) return PyErr_Format(PyExc_ValueError, "stored_walk: widths must be positive");
    Py_buffer buckets, firsts, lasts;
    if (get_buffer(o_buckets, &buckets, key_width, 0, "buckets") < 0) return NULL;
    if (get_buffer(o_firsts, &firsts, value_width, 0, "firsts") < 0) { PyBuffer_Release(&buckets); return NULL; }
    if (get_buffer(o_lasts, &lasts, value_width, 0, "lasts") < 0) {
        PyBuffer_Release(&firsts); PyBuffer_Release(&buckets); return NULL;
    }
    Py_ssize_t n = buckets.len / key_width;
    PyObject *result = NULL;
    char *out = NULL;
    Py_ssize_t used = 0, room = 0;
    if (firsts.len != n * value_width || lasts.len != n * value_width) {
        PyErr_SetString(PyExc_ValueError, "stored_walk: as many firsts and lasts as buckets are needed");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *key = (const char *)buckets.buf + i * key_width;
        const char *last = (const char *)lasts.buf + i * value_width;
        PyObject *call[2];
        call[0] = PyBytes_FromStringAndSize(key, key_width);
        call[1] = call[0] ? PyBytes_FromStringAndSize((const char *)firsts.buf + i * value_width, value_width) : NULL;
        int found = call[1] ? called_true(PyObject_Vectorcall(seek, call, 2, NULL)) : -1;
        Py_XDECREF(call[0]);
        Py_XDECREF(call[1]);
        while (found == 1) {
            int past = walked_value(value, key, key_width, last, value_width, &out, &used, &room);
            if (past != 0) { found = past < 0 ? -1 : 0; break; }
            found = called_true(PyObject_CallNoArgs(next_dup));
        }
        if (found < 0) goto done;
    }
    result = PyBytes_FromStringAndSize(out ? out : "", used);
done:
    PyMem_Free(out);
    PyBuffer_Release(&lasts);
    PyBuffer_Release(&firsts);
    PyBuffer_Release(&buckets);
    return result;
}

static PyMethodDef methods[] = {
    {"shingles", shingles, METH_VARARGS, "Sorted unique shingle hashes of every document (see the module)."},
    {"minhash", minhash, METH_VARARGS, "MinHash signatures of every document (see the module)."},
    {"ascii_normalize", ascii_normalize, METH_VARARGS, "The ASCII fast path of normalization (see the module)."},
    {"ef_encode", ef_encode, METH_VARARGS, "Elias-Fano coding of sorted unique uint32 values (see eliasfano.py)."},
    {"ef_encode_many", ef_encode_many, METH_VARARGS, "ef_encode of each document of (values, offsets)."},
    {"id_keys", id_keys, METH_VARARGS, "records.id_key of each id of a list."},
    {"shared_count", shared_count, METH_VARARGS, "Values two sorted unique uint32 arrays share."},
    {"sorted_member", sorted_member, METH_VARARGS, "Whether each uint32 value is in a sorted uint32 table, into out."},
    {"sorted_union", sorted_union, METH_VARARGS, "The sorted union of two sorted uint32 arrays, into out; how many."},
    {"sorted_without", sorted_without, METH_VARARGS, "uint32 values in neither of two sorted tables, into out; how many."},
    {"sorted_without_each", sorted_without_each, METH_VARARGS, "sorted_without both ways: not in the first table, in neither (see the module)."},
    {"ef_decode", ef_decode, METH_VARARGS, "The sorted uint32 values of an Elias-Fano coding (see eliasfano.py)."},
    {"merge_into", merge_into, METH_VARARGS, "A sorted run merged into sorted entries, in place (see the module)."},
    {"blake2b", blake2b_digest, METH_VARARGS, "hashlib.blake2b(data, digest_size=n).digest(), unkeyed."},
    {"prepare_ascii", prepare_ascii, METH_VARARGS, "Normalize, hash, shingle, narrow, sign and band ASCII texts (see the module)."},
    {"bloom_may_hold", bloom_may_hold, METH_VARARGS, "Whether the band filter's layers may hold each key (see the module)."},
    {"bloom_set", bloom_set, METH_VARARGS, "The band filter's bits of each key set in one layer (see the module)."},
    {"hits", hits, METH_VARARGS, "The (row, serial) pairs a batch's found entries meet, counted (see candidates.Hits)."},
    {"key_bits_set", key_bits_set, METH_VARARGS, "Set the presence bits of uint64 keys (see the module)."},
    {"key_bits_test", key_bits_test, METH_VARARGS, "Test the presence bits of uint64 keys into out (see the module)."},
    {"sort_entries", sort_entries, METH_VARARGS, "(key, value) entries sorted by key in place, stably."},
    {"band_slots_sorted", band_slots_sorted, METH_VARARGS, "A batch's band slots sorted (see the module)."},
    {"kept_entries", kept_entries, METH_VARARGS, "A batch's kept documents' entries from its sorted slots (see the module)."},
    {"pack_records", pack_records, METH_VARARGS, "Index records packed as DocRecord.pack does (see the module)."},
    {"sorted_matches", sorted_matches, METH_VARARGS, "Where sorted keys' entries under sorted asked keys are."},
    {"coded_shared", coded_shared, METH_VARARGS, "Values a sorted uint32 array shares with an Elias-Fano coding's."},
    {"coded_jaccards", coded_jaccards, METH_VARARGS, "Jaccard of arrays with codings (see the module)."},
    {"contents_without", contents_without, METH_VARARGS, "templates.content_of of each of a list (see templates.py)."},
    {"jaccards", jaccards, METH_VARARGS, "Jaccard of each pair of sorted unique uint32 arrays (see verify.py)."},
    {"record_id", record_id, METH_VARARGS, "The id of a packed index record (see the module)."},
    {"stored_walk", stored_walk, METH_VARARGS, "The rows of a dupsort table in asked ranges, through a cursor's methods (see the module)."},
    {"big_endian_keys", big_endian_keys, METH_VARARGS, "Each int of a list as width bytes, big-endian (see the module)."},
    {"row_pairs", row_pairs, METH_VARARGS, "Table rows laid end to end as putmulti's (key, value) tuples (see the module)."},
    {"by_serial", by_serial, METH_VARARGS, "getmulti's (key, value) pairs as a dict by serial (see the module)."},
    {"record_ids", record_ids, METH_VARARGS, "The ids of getmulti's packed records by serial (see the module)."},
    {"index_rows", index_rows, METH_VARARGS, "What write_documents files of each decided record (see the module)."},
    {"file_firsts", file_firsts, METH_VARARGS, "The recent mirror's hashes of committed documents (see the module)."},
    {"decision_lines", decision_lines, METH_VARARGS, "A batch's decisions file lines, joined (see the module)."},
    {"slotted", (PyCFunction)(void (*)(void))slotted, METH_FASTCALL, "An object of a slots class, its fields set without __init__ (see the module)."},
    {"kept_alone", kept_alone, METH_VARARGS, "A batch's items surely kept, from start to stop (see the module)."},
    {"record_batches", record_batches, METH_VARARGS, "Kafka v2 record batches of (timestamp_ms, key, value, headers) records (see the module)."},
    {"consumer_records", consumer_records, METH_VARARGS, "A v2 record batch's records as kafka-python's ConsumerRecords (see the module)."},
    {"json_id_keys", json_id_keys, METH_VARARGS, "The id key of each JSON record whose id a strict scan finds, else None (see the module)."},
    {"level_rows", level_rows, METH_VARARGS, "The recent mirror's entries under sorted slots, every level in one pass (see the block)."},
    {"earliest_runs", earliest_runs, METH_VARARGS, "Sorted (key, serial) runs merged, each key's first so many kept (see the block)."},
    {"bucket_starts", bucket_starts, METH_VARARGS, "Where each bucket of a sorted uint32 table starts (see the module)."},
    {"new_and_again", new_and_again, METH_VARARGS, "A page's values a site has not seen, and seen but not repeated (see the module)."},
    {"hashed_add", hashed_add, METH_VARARGS, "uint32 values put in an open-addressed table (see the module)."},
    {"hashed_moved", hashed_moved, METH_VARARGS, "An open-addressed table's values moved into a larger one (see the module)."},
    {"hashed_count", hashed_count, METH_VARARGS, "new_and_again on open-addressed tables, put in as it goes (see the module)."},
    {"hashed_member", hashed_member, METH_VARARGS, "Whether values are in an open-addressed table by a stamp (see the module)."},
    {"hashed_count_pages", hashed_count_pages, METH_VARARGS, "A batch's new pages: without their templates, counted in their sites' open-addressed tables (see the module)."},
    {"growing_member", growing_member, METH_VARARGS, "Whether each uint32 value is in a GrowingSet, into out (see the module)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernel", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__kernel(void) {
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddObject(m, "POLY_BASE_INVERSE", PyLong_FromUnsignedLongLong(POLY_BASE_INVERSE)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
