"""Is a new response the same stored variant? Questions on StoredEntry and header pairs, asked
on every 200 and 304 (RFC 9111 §4.1 Vary, §4.3.4 validators), kept out of the mitmproxy layer."""

from __future__ import annotations

from etiquette_proxy.headers import first_value
from etiquette_proxy.headers import HeaderPairs
from etiquette_proxy.revalidation.validators import StoredEntry, credentials_digest


def first_field(headers: HeaderPairs, name: str) -> str | None:
    """`first_value(headers, name)` for a lower-case `name`, stopping at the first match (no
    list of every value): read twice on every 200."""
    for k, v in headers:
        if k.lower() == name:
            return v
    return None


def same_variant(stored: StoredEntry, new: StoredEntry) -> bool:
    """Would `new` answer and revalidate exactly the requests `stored` does? (the body is
    compared by the caller): validators, Vary values (RFC 9111 §4.1) and credentials."""
    return ((stored.etag, stored.last_modified, stored.vary, stored.credentials)
            == (new.etag, new.last_modified, new.vary, new.credentials))


def same_variant_as(stored: StoredEntry, request_headers: HeaderPairs,
                     response_headers: HeaderPairs) -> bool | None:
    """`same_variant(stored, <the entry these headers would build>)` without building it (issue
    17: most of a repeated 200's cost), or None when the response names a Vary (then build)."""
    etag = last_modified = None  # the first values, as StoredEntry.build reads them
    seen_etag = seen_modified = False
    for name, value in response_headers:
        lname = name.lower()
        if lname == "vary":
            return None
        if lname == "etag":
            if not seen_etag:
                etag, seen_etag = value, True
        elif lname == "last-modified" and not seen_modified:
            last_modified, seen_modified = value, True
    # StoredEntry.build: validators are the first values; no Vary, no Vary values.
    return (stored.vary == () and stored.etag == etag and stored.last_modified == last_modified
            and stored.credentials == credentials_digest(request_headers))


def same_validators(entry: StoredEntry, response_headers: HeaderPairs) -> bool:
    """Would the site have answered 304 to the validators we would have sent? (observe mode)"""
    etag = first_value(response_headers, "etag")
    if entry.etag is not None:
        return etag is not None and etag.removeprefix("W/") == entry.etag.removeprefix("W/")
    modified = first_value(response_headers, "last-modified")
    return entry.last_modified is not None and modified == entry.last_modified


# A stored entry is rewritten after a 304 (or an identical 200) at most this often: a crawler
# re-checking a URL within a minute learns nothing new for its revisit schedule (floor: 1 h),
# and eviction order keeps a minute's granularity. A write per 304 was most of what a 304 cost
# (benchmarks/README.md, overhead).
REFRESH_EVERY_S = 60.0


def written_lately(entry: StoredEntry, now: float) -> bool:
    """Was `entry` stored less than REFRESH_EVERY_S ago (and not in the clock's future)?"""
    return 0 <= now - entry.stored_at < REFRESH_EVERY_S


def rewrite_after_304(entry: StoredEntry, merged: StoredEntry, now: float) -> bool:
    """After a 304 merged `entry` into `merged`: is the row worth rewriting? Not when it was
    written lately with the same validators (the client still gets the merged headers)."""
    return not (written_lately(entry, now)
                and (merged.etag, merged.last_modified) == (entry.etag, entry.last_modified))
