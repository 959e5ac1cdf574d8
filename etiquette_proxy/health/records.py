"""The compact records of a site's health history (SPEC §8): a closed window and a day as one
immutable `bytes` each (a 3-request window is 64 bytes, a 60-request one ~80; as objects, a
record, its Tally, LatencySketch, array and floats were ~400). `WindowRecord` and `DayRecord`
hold only what the compact form cannot say exactly (a latency sketch grown into a dict, a count
past 64 bits, a score stored as an int), and decide the same. How they are kept and rolled into
days: history.py.
"""

from __future__ import annotations

import math
import struct
from typing import Any

from etiquette_proxy.health.score import _SPAN, LatencySketch, Tally, tally_counts


def is_number(x: Any) -> bool:
    """A finite int or float (not a bool): what a persisted number must be."""
    if type(x) is float:  # what JSON gives back, most often
        return x - x == 0.0  # not an infinity or NaN
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def is_count(x: Any) -> bool:
    """A non-negative int (not a bool)."""
    if type(x) is int:
        return x >= 0
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _opt_number(x: Any) -> bool:
    return x is None or is_number(x)


class WindowRecord:
    """One closed window: what was scored, its raw and smoothed score, whether it was stable."""

    __slots__ = ("start", "tally", "raw", "smoothed", "stable")

    def __init__(
        self,
        start: float,
        tally: Tally,
        raw: float | None = None,
        smoothed: float | None = None,
        stable: bool = False,
    ):
        self.start = start
        self.tally = tally
        self.raw = raw
        self.smoothed = smoothed
        self.stable = stable

    def to_state(self) -> list[Any]:
        return [self.start, self.tally.to_state(), self.raw, self.smoothed, self.stable]


def _check_window(s: Any) -> None:
    if not (
        isinstance(s, list)
        and len(s) == 5
        and is_number(s[0])
        and _opt_number(s[2])
        and _opt_number(s[3])
        and isinstance(s[4], bool)
    ):
        raise ValueError("health window: expected [start, tally, raw, smoothed, stable]")


class DayRecord:
    """One UTC day of rolled-up windows."""

    __slots__ = ("start", "tally", "stable", "score_min", "score_sum", "score_n")

    def __init__(
        self,
        start: float,
        tally: Tally,
        stable: int = 0,
        score_min: float | None = None,
        score_sum: float = 0.0,
        score_n: int = 0,
    ):
        self.start = start
        self.tally = tally
        self.stable = stable
        self.score_min = score_min
        self.score_sum = score_sum
        self.score_n = score_n

    def add(self, w: WindowRecord) -> None:
        self.tally.merge(w.tally)
        self.stable += w.stable
        if w.smoothed is not None:
            self.score_min = (
                w.smoothed if self.score_min is None else min(self.score_min, w.smoothed)
            )
            self.score_sum += w.smoothed
            self.score_n += 1

    def to_state(self) -> list[Any]:
        return [
            self.start,
            self.tally.to_state(),
            self.stable,
            self.score_min,
            self.score_sum,
            self.score_n,
        ]



def _check_day(s: Any) -> None:
    if not (
        isinstance(s, list)
        and len(s) == 6
        and is_number(s[0])
        and is_count(s[2])
        and _opt_number(s[3])
        and is_number(s[4])
        and is_count(s[5])
    ):
        raise ValueError("health day: expected [start, tally, stable, min, sum, n]")


# -- the compact records -------------------------------------------------------------------------
# A closed window as bytes: a flags byte, the lowest latency bucket (signed), how many buckets
# follow, then little-endian doubles (start, raw and smoothed when present) and unsigned counts
# of one width (n, hard, challenge, soft, error, then the latency counts from the lowest bucket
# on, zeros between, as the sketch's array holds them). A day: the same three bytes, doubles
# start, score_sum (and score_min when present), counts stable, score_n, n, hard, challenge,
# soft, error and the latency counts.
_STABLE, _RAW, _SMOOTHED = 1, 2, 4  # window flags (a day's bit 0: score_min present)
_WIDE = 3  # bits 3-4: the counts' width (2, 4 or 8 bytes)
_MARK = 5  # bits 5-7: a window's mark, what site.py says of it beside the history (0: none)
_CODES = ("H", "I", "Q")
_LIMITS = (1 << 16, 1 << 32, 1 << 64)
_START = struct.Struct("<3xd")  # a record's start, either kind
_WINDOW_FORMS: dict[int, struct.Struct] = {}
_DAY_FORMS: dict[int, struct.Struct] = {}

DAY = 86400.0  # what one day record spans (UTC days)
Record = bytes | WindowRecord
Day = bytes | DayRecord


def _form(forms: dict[int, struct.Struct], flags: int, nb: int, doubles: int, counts: int) -> struct.Struct:
    key = (flags & 0x1F) << 8 | nb  # the flags that shape the record (and a window's stable bit)
    form = forms.get(key)
    if form is None:
        form = forms[key] = struct.Struct(f"<BbB{doubles}d{counts + nb}{_CODES[flags >> _WIDE & 3]}")
    return form


def _window_form(flags: int, nb: int) -> struct.Struct:
    form = _WINDOW_FORMS.get((flags & 0x1F) << 8 | nb)
    return form or _form(_WINDOW_FORMS, flags, nb, 1 + (flags >> 1 & 1) + (flags >> 2 & 1), 5)


def _day_form(flags: int, nb: int) -> struct.Struct:
    return _form(_DAY_FORMS, flags, nb, 2 + (flags & 1), 7)


def _width(top: int) -> int | None:
    for w, limit in enumerate(_LIMITS):
        if top < limit:
            return w
    return None


def _run_fits(run: Any) -> bool:
    low, counts = run
    return not counts or (-128 <= low and low + len(counts) <= 128)


def pack_window(
    start: float, tally: Tally, raw: float | None, smoothed: float | None, stable: bool, mark: int = 0
) -> Record:
    """The closed window as a compact record, or as a WindowRecord when that cannot say it."""
    run = tally.latency.run()
    packed = None if run is None else _pack_window(
        start, raw, smoothed, stable, tally.n, tally.hard, tally.challenge, tally.soft, tally.error, *run, mark)
    return WindowRecord(start, tally, raw, smoothed, stable) if packed is None else packed


def _pack_window(
    start: float, raw: float | None, smoothed: float | None, stable: bool, n: int, hard: int, challenge: int,
    soft: int, error: int, low: int, counts: Any, mark: int,
) -> bytes | None:
    """The compact record of a window, or None when it cannot say it exactly."""
    if (
        type(start) is not float
        or type(stable) is not bool
        or (raw is not None and type(raw) is not float)
        or (smoothed is not None and type(smoothed) is not float)
    ):
        return None
    nb = len(counts)
    if nb and (low < -128 or low + nb > 128):
        return None
    top = max(n, hard, challenge, soft, error, *counts)
    width = 0 if top < 0x10000 else 1 if top < 0x100000000 else 2 if top < _LIMITS[2] else None
    if width is None:
        return None
    flags = stable | width << _WIDE | mark << _MARK
    if raw is None and smoothed is None:
        return _window_form(flags, nb).pack(flags, low, nb, start, n, hard, challenge, soft, error, *counts)
    doubles = [start]
    if raw is not None:
        flags |= _RAW
        doubles.append(raw)
    if smoothed is not None:
        flags |= _SMOOTHED
        doubles.append(smoothed)
    return _window_form(flags, nb).pack(flags, low, nb, *doubles, n, hard, challenge, soft, error, *counts)


def with_mark(record: bytes, mark: int) -> bytes:
    """The compact record marked `mark` (0..7)."""
    return bytes((record[0] & 0x1F | mark << _MARK,)) + record[1:]


def window_mark(record: Any) -> int:
    """A compact record's mark (0: none, or not a compact record)."""
    return record[0] >> _MARK if type(record) is bytes else 0


def window_start(record: Record) -> float:
    return _START.unpack_from(record)[0] if type(record) is bytes else record.start  # type: ignore[union-attr]


def verdict_head(record: bytes) -> tuple[float, bool]:
    """A compact record's start, and whether it was scored (has a raw score)."""
    flags, start = _FLAGS_START.unpack_from(record)
    return start, bool(flags & _RAW)


_FLAGS_START = struct.Struct("<B2xd")


def window_fields(record: Record) -> tuple[float, float | None, float | None, bool, int]:
    """(start, raw, smoothed, stable, requests) of either kind of window record."""
    if type(record) is not bytes:
        r: WindowRecord = record  # type: ignore[assignment]
        return r.start, r.raw, r.smoothed, r.stable, r.tally.n
    flags = record[0]
    v = _window_form(flags, record[2]).unpack_from(record)
    i = 4
    raw = smoothed = None
    if flags & _RAW:
        raw, i = v[i], i + 1
    if flags & _SMOOTHED:
        smoothed, i = v[i], i + 1
    return v[3], raw, smoothed, bool(flags & _STABLE), v[i]


def _window_parts(record: bytes) -> tuple[tuple[Any, ...], int]:
    """The unpacked fields of a compact window and the index of its first count."""
    flags = record[0]
    return _window_form(flags, record[2]).unpack_from(record), 4 + (flags >> 1 & 1) + (flags >> 2 & 1)


def window_record(record: Record) -> WindowRecord:
    """Either kind of window record as a WindowRecord (its own objects, for the rare paths)."""
    if type(record) is not bytes:
        return record  # type: ignore[return-value]
    v, i = _window_parts(record)
    start, raw, smoothed, stable, _ = window_fields(record)
    return WindowRecord(start, _tally(v, i, v[1], v[i + 5:]), raw, smoothed, stable)


def _tally(v: tuple[Any, ...], i: int, low: int, counts: Any) -> Tally:
    """The Tally of counts v[i:i + 5] and the latency counts `counts` from bucket `low`."""
    return Tally(v[i], v[i + 1], v[i + 2], v[i + 3], v[i + 4], LatencySketch.of_run(low, counts))


def _sketch_state(low: int, counts: Any) -> list[int]:
    """LatencySketch.to_state of the run `counts` from bucket `low`: [bucket, count, ...]."""
    if 0 in counts:  # a gap in the run
        return [x for k, c in enumerate(counts) if c for x in (low + k, c)]
    out = [0] * (2 * len(counts))
    out[::2] = range(low, low + len(counts))
    out[1::2] = counts
    return out


def window_state(record: Record) -> list[Any]:
    """`WindowRecord.to_state` of either kind."""
    if type(record) is not bytes:
        return record.to_state()  # type: ignore[union-attr]
    flags = record[0]
    v = (_WINDOW_FORMS.get((flags & 0x1F) << 8 | record[2]) or _window_form(flags, record[2])).unpack_from(record)
    i = 4
    raw = smoothed = None
    if flags & _RAW:
        raw, i = v[i], i + 1
    if flags & _SMOOTHED:
        smoothed, i = v[i], i + 1
    sketch = _sketch_state(v[1], v[i + 5:]) if v[2] else []
    return [v[3], [v[i], v[i + 1], v[i + 2], v[i + 3], v[i + 4], sketch], raw, smoothed, bool(flags & _STABLE)]


def window_from_state(s: Any) -> Record:
    """`WindowRecord.from_state` (the same checks, in the same order), compact where it can be."""
    _check_window(s)
    parts = tally_parts(s[1])
    if parts is None:
        return WindowRecord(float(s[0]), Tally.from_state(s[1]), s[2], s[3], s[4])
    start = float(s[0])
    n, hard, challenge, soft, error, low, counts = parts
    packed = _pack_window(start, s[2], s[3], s[4], n, hard, challenge, soft, error, low, counts, 0)
    if packed is None:
        tally = Tally(n, hard, challenge, soft, error, LatencySketch.of_run(low, counts))
        return WindowRecord(start, tally, s[2], s[3], s[4])
    return packed


def tally_parts(state: Any) -> tuple[Any, ...] | None:
    """Tally.from_state's checks of `state` (raising as it does); its counts and its sketch's
    run (low, counts), or None when the sketch would not be an array (a sum past 64 bits)."""
    # What JSON gives back, checked at once; anything else by the checks below, one by one.
    if type(state) is list and len(state) == 6:
        n, hard, challenge, soft, error, sketch = state
        if (
            type(n) is int and type(hard) is int and type(challenge) is int and type(soft) is int
            and type(error) is int and hard >= 0 and challenge >= 0 and soft >= 0 and error >= 0
            and hard + challenge + soft + error <= n and type(sketch) is list and len(sketch) <= 400
        ):
            if not sketch:
                return n, hard, challenge, soft, error, 0, ()
            sums: dict[int, int] = {}
            it = iter(sketch)
            for b in it:
                c = next(it, None)
                if type(b) is not int or type(c) is not int or c <= 0 or not -10 <= b <= 100:
                    break
                sums[b] = sums.get(b, 0) + c
            else:
                return _parts_of(n, hard, challenge, soft, error, sums)
    return _checked_tally_parts(state)


def _parts_of(n: int, hard: int, challenge: int, soft: int, error: int,
              sums: dict[int, int]) -> tuple[Any, ...] | None:
    # Counts added in any order make the same array (every bucket -10..100 is within its
    # span) unless a sum reaches 64 bits: then LatencySketch.from_state decides.
    if max(sums.values()) >> 64:
        return None
    low, high = min(sums), max(sums)
    if low == high:
        return n, hard, challenge, soft, error, low, (sums[low],)
    return n, hard, challenge, soft, error, low, [sums.get(b, 0) for b in range(low, high + 1)]


def _checked_tally_parts(state: Any) -> tuple[Any, ...] | None:
    n, hard, challenge, soft, error = tally_counts(state)
    sketch = state[5]
    if not isinstance(sketch, list) or len(sketch) % 2 or len(sketch) > 400:
        raise ValueError("latency sketch: expected [bucket, count, ...]")
    if not sketch:
        return n, hard, challenge, soft, error, 0, ()
    sums: dict[int, int] = {}
    for b, c in zip(sketch[::2], sketch[1::2], strict=True):
        if not (_is_int(b) and _is_int(c) and c > 0 and -10 <= b <= 100):
            raise ValueError("latency sketch: bad bucket")
        sums[b] = sums.get(b, 0) + c
    return _parts_of(n, hard, challenge, soft, error, sums)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


# -- days ------------------------------------------------------------------------------------------


def _pack_day(
    start: float, n: int, hard: int, challenge: int, soft: int, error: int, run: Any,
    stable: int, score_min: float | None, score_sum: float, score_n: int,
) -> bytes | None:
    if (
        run is None
        or type(start) is not float
        or not (score_min is None or type(score_min) is float)
        or type(score_sum) is not float
        or type(stable) is not int
        or type(score_n) is not int
        or not _run_fits(run)
    ):
        return None
    low, counts = run
    width = _width(max(stable, score_n, n, hard, challenge, soft, error, *counts))
    if width is None:
        return None
    flags = (score_min is not None) | width << _WIDE
    doubles = [start, score_sum] + ([] if score_min is None else [score_min])
    return _day_form(flags, len(counts)).pack(
        flags, low, len(counts), *doubles, stable, score_n, n, hard, challenge, soft, error, *counts
    )


def pack_day(d: DayRecord) -> Day:
    """The day as a compact record, or as it is when that cannot say it."""
    t = d.tally
    packed = _pack_day(d.start, t.n, t.hard, t.challenge, t.soft, t.error, t.latency.run(),
                       d.stable, d.score_min, d.score_sum, d.score_n)
    return d if packed is None else packed


def _day_parts(day: bytes) -> tuple[tuple[Any, ...], float | None, int]:
    """The unpacked fields of a compact day, its score_min, and the index of its `stable`."""
    flags = day[0]
    v = _day_form(flags, day[2]).unpack_from(day)
    if flags & 1:
        return v, v[5], 6
    return v, None, 5


def day_record(day: Day) -> DayRecord:
    """Either kind of day record as a DayRecord."""
    if type(day) is not bytes:
        return day  # type: ignore[return-value]
    v, score_min, i = _day_parts(day)
    return DayRecord(v[3], _tally(v, i + 2, v[1], v[i + 7:]), v[i], score_min, v[4], v[i + 1])


def day_state(day: Day) -> list[Any]:
    """`DayRecord.to_state` of either kind."""
    if type(day) is not bytes:
        return day.to_state()  # type: ignore[union-attr]
    v, score_min, i = _day_parts(day)
    return [v[3], [*v[i + 2:i + 7], _sketch_state(v[1], v[i + 7:])], v[i], score_min, v[4], v[i + 1]]


def day_from_state(s: Any) -> Day:
    """`DayRecord.from_state` (the same checks, in the same order), compact where it can be."""
    _check_day(s)
    parts = tally_parts(s[1])
    packed = None
    if parts is not None:
        n, hard, challenge, soft, error, low, counts = parts
        packed = _pack_day(float(s[0]), n, hard, challenge, soft, error, (low, counts),
                           s[2], s[3], float(s[4]), s[5])
    if packed is None:
        return DayRecord(float(s[0]), Tally.from_state(s[1]), s[2], s[3], float(s[4]), s[5])
    return packed


def day_with(day: Day, w: Record) -> Day:
    """`day` with window `w` rolled into it (DayRecord.add)."""
    if type(day) is bytes and type(w) is bytes:
        v, score_min, i = _day_parts(day)
        u, j = _window_parts(w)
        flags = w[0]
        smoothed = u[j - 1] if flags & _SMOOTHED else None
        stable, score_sum, score_n = v[i] + (flags & _STABLE), v[4], v[i + 1]
        if smoothed is not None:
            score_min = smoothed if score_min is None else min(score_min, smoothed)
            score_sum += smoothed
            score_n += 1
        run = _merged_run(v[1], v[i + 7:], u[1], u[j + 5:])
        packed = _pack_day(v[3], v[i + 2] + u[j], v[i + 3] + u[j + 1], v[i + 4] + u[j + 2], v[i + 5] + u[j + 3],
                           v[i + 6] + u[j + 4], run, stable, score_min, score_sum, score_n)
        if packed is not None:
            return packed
    d = day_record(day)  # a compact day: objects of its own, the bytes are left as they were
    d.add(window_record(w))
    return pack_day(d)


def _merged_run(low: int, counts: Any, wlow: int, wcounts: Any) -> tuple[int, list[int]] | None:
    """Two arrays' counts summed as LatencySketch.merge leaves them (None where the sketch turns
    into a dict: a sum past 64 bits, or buckets spread wider than its array spans)."""
    if not wcounts:
        return low, list(counts)
    if not counts:
        return wlow, list(wcounts)
    lo = min(low, wlow)
    out = [0] * (max(low + len(counts), wlow + len(wcounts)) - lo)
    for k, c in enumerate(counts):
        out[low - lo + k] = c
    for k, c in enumerate(wcounts):
        out[wlow - lo + k] += c
    if max(out) >> 64 or len(out) > _SPAN:
        return None
    return lo, out


def day_start(day: Day) -> float:
    return _START.unpack_from(day)[0] if type(day) is bytes else day.start  # type: ignore[union-attr]


# -- many records at once: the history's questions, read straight from the records -------------


def empty_day(start: float) -> Day:
    """The record of a day nothing has rolled into yet."""
    return _pack_day(start, 0, 0, 0, 0, 0, (0, ()), 0, None, 0.0, 0) or DayRecord(start, Tally())


def day_summary(d: Day) -> tuple[float, float | None, float, int, int]:
    """(start, lowest score, score sum, scores, requests) of one day record."""
    if type(d) is bytes:
        v, score_min, i = _day_parts(d)
        return v[3], score_min, v[4], v[i + 1], v[i + 2]
    return d.start, d.score_min, d.score_sum, d.score_n, d.tally.n  # type: ignore[union-attr]


def scores(windows: Any) -> list[tuple[float, int | None]]:
    """(window start, smoothed score) of `windows`, in their order."""
    out = []
    for w in windows:
        start, _, smoothed, _, _ = window_fields(w)
        out.append((start, None if smoothed is None else round(smoothed)))
    return out


def span(windows: Any, days: Any, lo: float, hi: float) -> tuple[Tally | None, int]:
    """Pooled tally and stable-window count of the days and windows that started in [lo, hi)
    (whole days only; `windows` in order of their start; no tally when nothing did)."""
    # What a baseline reads of the pooled tally (its counts, and its latency p95 from the
    # buckets' sums) does not depend on the order the records were merged in, so the compact
    # records' counts are summed here as they are read, with no objects of their own.
    n = hard = challenge = soft = error = stable = 0
    sums: dict[int, int] = {}
    for d in days:
        if type(d) is bytes:
            v, _, i = _day_parts(d)
            if v[3] >= lo and v[3] + DAY <= hi:
                stable += v[i]
                n, hard, challenge, soft, error = (n + v[i + 2], hard + v[i + 3], challenge + v[i + 4],
                                                   soft + v[i + 5], error + v[i + 6])
                _add_run(sums, v[1], v[i + 7:])
        elif d.start >= lo and d.start + DAY <= hi:
            t = d.tally
            stable += d.stable
            n, hard, challenge, soft, error = (n + t.n, hard + t.hard, challenge + t.challenge, soft + t.soft,
                                               error + t.error)
            for b, c in t.latency.buckets.items():
                sums[b] = sums.get(b, 0) + c
    window_form, start_of = _window_form, _START.unpack_from
    for w in windows:
        if type(w) is bytes:
            start = start_of(w)[0]
            if start >= hi:
                break
            if start >= lo:
                flags = w[0]
                v = window_form(flags, w[2]).unpack_from(w)
                i = 4 + (flags >> 1 & 1) + (flags >> 2 & 1)
                stable += flags & _STABLE
                n, hard, challenge, soft, error = (n + v[i], hard + v[i + 1], challenge + v[i + 2],
                                                   soft + v[i + 3], error + v[i + 4])
                if v[2]:
                    _add_run(sums, v[1], v[i + 5:])
            continue
        r: WindowRecord = w
        if r.start >= hi:
            break
        if r.start >= lo:
            t = r.tally
            stable += r.stable
            n, hard, challenge, soft, error = (n + t.n, hard + t.hard, challenge + t.challenge, soft + t.soft,
                                               error + t.error)
            for b, c in t.latency.buckets.items():
                sums[b] = sums.get(b, 0) + c
    if not (n or stable or sums):
        return None, 0
    total = Tally(n, hard, challenge, soft, error)
    for b in sorted(sums):
        if sums[b]:
            total.latency.add_count(b, sums[b])
    return total, stable


def _add_run(sums: dict[int, int], low: int, counts: Any) -> None:
    for k, c in enumerate(counts, low):
        if c:
            sums[k] = sums.get(k, 0) + c
