"""Revalidation: the crawler gets the bandwidth savings of one that knows ETags (SPEC §6).

The addon only orders calls over the core (urlkey, validators, fingerprint, revisit, store):

- request: with revisit.enforce, a URL before its next check is answered from the store
  (`served-stored`); else, if the client sent no conditional or range header and a stored entry
  matches (Vary, credentials), If-None-Match / If-Modified-Since are added. The entry and its
  body are read *now* and kept with the flow, so the 304 can be answered even if the store
  evicts or replaces them meanwhile (the client never gets a 304 it did not ask for).
- response: a 304 to our validators becomes the stored 200 with headers updated from the 304
  (`revalidated`); a 304 to the client's own conditionals passes through (`unchanged`); a 200
  is fingerprinted (`changed`), scheduled (revisit) and stored; a 404/410 drops the entry.

The stored body is the *raw* body as received, with the received Content-Encoding header kept
beside it (RFC 9111 §3.2: a 304 never updates Content-Encoding), so a gzip answer is replayed as
the same gzip bytes. Fingerprints are taken of the decoded body.

In observe mode nothing on the wire changes: no validators are added and nothing is answered
locally; `would` records `served-stored`, or `revalidated` when the site's 200 carried the
validators we would have sent (so enforce mode would have got a 304).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple, TypeVar

from addons.answers import FAULTS, answer_locally, fail_closed
from addons.audit_log import DECISION_HEADER
from addons.notes import FlowNotes, notes_of, skip
from addons.runtime import Runtime
from addons.sitemaps import SitemapHooks
from addons.store_keys import store_key
from etiquette_proxy.side_fetch import SideFetchError, fetch
from addons.streaming import body_of
from mitmproxy import http

from etiquette_proxy.clock import wall
from etiquette_proxy.revalidation.fingerprint import (  # noqa: F401 - decoded_for_fingerprint: tests
    DECODE_FACTOR,
    body_digest,
    decoded_for_fingerprint,
)
from etiquette_proxy.revalidation.recent import Recent
from etiquette_proxy.revalidation.revisit import NAMESPACE as REVISIT
from etiquette_proxy.revalidation.revisit import RevisitState, fetch_changed
from etiquette_proxy.revalidation.service import THREAD_ABOVE, stored_body
from etiquette_proxy.revalidation.site_rules import BySite, StoreRules
from etiquette_proxy.revalidation.store import HOT_ENTRIES
from etiquette_proxy.revalidation.validators import (
    Answer304,
    HeaderPairs,
    Injection,
    StoredEntry,
    answer_304,
    inject_headers,
    may_serve_unvalidated,
    should_store_pairs,
    stored_response_headers,
)
from etiquette_proxy.revalidation.variants import first_field, rewrite_after_304, written_lately
from etiquette_proxy.revalidation.variants import same_validators as _same_validators
from etiquette_proxy.revalidation.variants import same_variant as _same_variant
from etiquette_proxy.revalidation.variants import same_variant_as as _same_variant_as

log = logging.getLogger(__name__)

# Injections kept (Recent): as many as the store keeps entries hot. A kept injection is found
# again only with the very entry object it was worked out for, and the store hands out the
# same object while the entry stays in its hot set (store.py HOT_ENTRIES): with fewer kept, a
# crawl revisiting more URLs than that in turn (e.g. 2,000 pages polled in rotation) found
# every entry hot and none of their injections (issue 17: 4.2 µs per request, decisions.py's
# store, whose 4,096 URLs in turn are such a crawl). Each kept value is small (the validators,
# encoded, and their names) beside the entry, which it keeps alive: up to HOT_ENTRIES more
# entries than the hot set holds, ~1.5 KB each at most (~6 MB).
INJECTIONS_KEPT = HOT_ENTRIES

REFETCH_TIMEOUT_S = 30.0

_HAD_ENTRY = "etiquette_had_entry"  # a stored entry existed when the request went out
_INJECTED = "etiquette_injected"  # Injected: what we added, with the entry and body it relied on
_WOULD_INJECT = "etiquette_would_inject"  # observe mode: the entry we would have revalidated

_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "te", "trailer",
                         "transfer-encoding", "upgrade", "content-length", "content-encoding"})

T = TypeVar("T")
_DECISION_NAME = DECISION_HEADER.lower().encode("ascii")


def site_headers(message: http.Message) -> HeaderPairs:
    """The message's headers as the site sent them: without the decision header the audit writer
    has already added in `responseheaders` (it must never be stored or merged); decoded as
    `decoded` decodes them, in the same pass."""
    return tuple([(k.decode("utf-8", "surrogateescape"), v.decode("utf-8", "surrogateescape"))
                  for k, v in message.headers.fields if k.lower() != _DECISION_NAME])


def decoded(fields: tuple[tuple[bytes, bytes], ...]) -> HeaderPairs:
    """Raw header fields as text pairs, decoded as mitmproxy's `Headers.items(multi=True)`
    decodes them (utf-8, surrogateescape), without its per-field calls."""
    return tuple([(k.decode("utf-8", "surrogateescape"), v.decode("utf-8", "surrogateescape")) for k, v in fields])


class Injected(NamedTuple):
    """Validators added to a request, and the stored entry and body a 304 will be answered from
    (made for every revalidated request: a NamedTuple is built in one call, a frozen
    dataclass sets each field through object.__setattr__)."""

    entry: StoredEntry
    body: bytes
    names: tuple[str, ...]
    said: str  # the audit reason of a 304 to them (worked out once with the injection)


def encoded(headers: HeaderPairs) -> tuple[tuple[bytes, bytes], ...]:
    """Header pairs as the bytes mitmproxy keeps (`Headers.fields`)."""
    return tuple((k.encode("utf-8", "surrogateescape"), v.encode("utf-8", "surrogateescape")) for k, v in headers)


def stored_fields(headers: HeaderPairs, body_size: int) -> tuple[tuple[bytes, bytes], ...]:
    """The header fields of a stored 200: `headers`, framed for a body of `body_size` bytes."""
    return encoded(tuple((k, v) for k, v in headers if k.lower() != "content-length")
                   + (("Content-Length", str(body_size)),))


def set_stored_response(response: http.Response, body: bytes, headers: HeaderPairs) -> None:
    """Turn `response` into a 200 carrying the stored raw body (its Content-Encoding kept)."""
    set_stored_fields(response, body, stored_fields(headers, len(body)))


def set_stored_fields(response: http.Response, body: bytes, fields: tuple[tuple[bytes, bytes], ...]) -> None:
    """`set_stored_response` with the header fields encoded already (framed for `body`)."""
    response.status_code = 200
    response.data.reason = b"OK"  # what the reason setter stores, without its always_bytes call
    # The fields are checked bytes pairs already (encoded() made them) and immutable, so they
    # replace the response's own fields as they are: every Headers edit builds a new tuple,
    # never changes this one. (A new Headers would check and copy each field again.)
    response.headers.fields = fields
    # raw_content, not content: the content setter would encode the body a second time.
    response.raw_content = body


class Revalidation:
    def __init__(self, runtime: Runtime, sitemaps: SitemapHooks | None = None):
        self.rt = runtime
        # SPEC §6 change signals: a sitemap's lastmod makes a URL due (request) and is scored
        # against what its fetch found (response); chain.py hands in the sitemap hooks.
        self.sitemaps = sitemaps
        # revisit, fingerprint and sitemap settings: read once per site and config (site_rules.py)
        self.rules: BySite[StoreRules] = BySite(StoreRules.from_config)
        # (id(entry), header fields) -> (entry, result, encoded fields); the entry is kept, so
        # its id cannot be reused while the result is here.
        self._injections: Recent[tuple[int, Any], tuple[StoredEntry, Injection, Any, tuple[str, ...], str]] = \
            Recent(INJECTIONS_KEPT)
        self._merges: Recent[tuple[int, Any], tuple[StoredEntry, Answer304, Any]] = Recent()

    # -- request: served-stored, or inject validators ------------------------------------------

    def request(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        # Synchronous on the common path (validators injected from a body kept in memory): the
        # chain then builds no coroutine for this member (chain.py). Only a body read in a
        # worker thread (over THREAD_ABOVE) or served unchecked returns a coroutine.
        if skip(flow) or self.rt.store is None or flow.request.method != "GET":
            return None
        notes = notes_of(flow)
        try:
            pending = self._before(flow, notes)
        except Exception as e:  # noqa: BLE001 - a saving, not a permission: forward unaltered
            self._forward_plain(flow, notes, e)
            return None
        if pending is None:
            return None
        return self._before_rest(flow, notes, pending)

    async def _before_rest(self, flow: http.HTTPFlow, notes: FlowNotes, pending: Awaitable[None]) -> None:
        try:
            await pending
        except Exception as e:  # noqa: BLE001 - as in request()
            self._forward_plain(flow, notes, e)

    @staticmethod
    def _forward_plain(flow: http.HTTPFlow, notes: FlowNotes, e: Exception) -> None:
        FAULTS.report("revalidation", e, "requests it meets are forwarded without validators")
        flow.metadata.pop(_INJECTED, None)
        notes.extra.pop("injected", None)

    def _before(self, flow: http.HTTPFlow, notes: FlowNotes) -> Awaitable[None] | None:
        """Serve the stored copy, or inject the stored validators: None when done at once, else
        the coroutine that reads a stored body in a worker thread and finishes the work."""
        store = self.rt.store
        assert store is not None
        key = store_key(flow, self.rt, self.rules)
        if key is None:
            return None
        rules = self.rules.get(self.rt.config, notes.site)
        policy = rules.revisit
        state: RevisitState | None = None
        if policy.enforce:  # the schedule rides in the entry's row: one read for both
            entry, state = store.get_with_record(key, REVISIT, parse=RevisitState.from_state)
        else:
            entry = store.get(key)
        if entry is None:
            return None
        flow.metadata[_HAD_ENTRY] = True

        if policy.enforce:
            request_headers = decoded(flow.request.headers.fields)
            decision = policy.serve_stored(state, wall())
            sitemaps = self.sitemaps.service(notes.site) if self.sitemaps is not None else None
            if decision.serve_stored and sitemaps is not None and sitemaps.asks_site(key, state, notes.extra):
                pass  # SPEC §6: the sitemap's lastmod moved (or this is a sitemap): ask the site
            elif decision.serve_stored and may_serve_unvalidated(entry, request_headers).ok:
                reason = f"stored copy, not checked with the site: {decision.reason} (revisit.enforce)"
                if self.rt.observe:
                    notes.would_do("served-stored", reason)
                    return None
                return self._serve_stored(flow, notes, key, entry, reason)
        return self._validate(flow, notes, key, entry)

    def _validate(self, flow: http.HTTPFlow, notes: FlowNotes, key: str, entry: StoredEntry) -> Awaitable[None] | None:
        """The stored validators injected into the request (RFC 9110 §13.1): None when done at
        once, else the coroutine reading a large stored body first."""
        store = self.rt.store
        assert store is not None
        injection, fields, names, said = self._injection(entry, flow.request.headers.fields)
        if not injection.inject or injection.entry is None:
            log.debug("no validators for %s: %s", key, injection.reason)
            return None
        if self.rt.observe:
            flow.metadata[_WOULD_INJECT] = injection.entry
            return None
        entry = injection.entry
        if entry.body_size > THREAD_ABOVE:
            return self._inject_read(flow, notes, key, entry, fields, names, said)
        # A small body straight from the store (no coroutine: most are kept in memory).
        self._inject(flow, notes, key, entry, store.body(entry), fields, names, said)
        return None

    async def _inject_read(self, flow: http.HTTPFlow, notes: FlowNotes, key: str, entry: StoredEntry,
                           fields: tuple[tuple[bytes, bytes], ...], names: tuple[str, ...], said: str) -> None:
        assert self.rt.store is not None
        self._inject(flow, notes, key, entry, await stored_body(self.rt.store, entry), fields, names, said)

    @staticmethod
    def _inject(flow: http.HTTPFlow, notes: FlowNotes, key: str, entry: StoredEntry, body: bytes | None,
                fields: tuple[tuple[bytes, bytes], ...], names: tuple[str, ...], said: str) -> None:
        if body is None:  # evicted or damaged since the entry was read: a plain fetch
            log.info("stored body for %s is missing or damaged; not revalidating", key)
            return
        # inject_headers adds nothing when the client sent a conditional of its own, so these
        # names are not in the request yet: appending is setting them.
        flow.request.headers.fields += fields
        flow.metadata[_INJECTED] = Injected(entry, body, names, said)
        notes.extra["injected"] = list(names)

    async def _serve_stored(self, flow: http.HTTPFlow, notes: FlowNotes, key: str, entry: StoredEntry,
                            reason: str) -> None:
        store = self.rt.store
        assert store is not None
        body = await stored_body(store, entry)
        if body is None:  # gone since the entry was read: ask the site, with validators if any
            pending = self._validate(flow, notes, key, entry)
            if pending is not None:
                await pending
            return
        notes.outcome, notes.reason, notes.local = "served-stored", reason, True
        # RFC 9111 §5.1: a stored response carries its Age.
        age = str(int(max(0.0, wall() - entry.stored_at)))
        headers = tuple((k, v) for k, v in stored_response_headers(entry)
                        if k.lower() != "age") + (("Age", age),)
        flow.response = http.Response.make(200)
        set_stored_response(flow.response, body, headers)
        store.touch(entry)  # a use: keeps the page young for eviction

    def _injection(self, entry: StoredEntry, request_fields: tuple[tuple[bytes, bytes], ...],
                   ) -> tuple[Injection, tuple[tuple[bytes, bytes], ...], tuple[str, ...], str]:
        """inject_headers for this entry and request, the header fields to add (encoded), their
        names and the audit reason of a 304 to them."""
        kept = self._injections.get((id(entry), request_fields))
        if kept is not None and kept[0] is entry:
            return kept[1], kept[2], kept[3], kept[4]
        injection = inject_headers(entry, "GET", decoded(request_fields))
        fields = encoded(injection.headers)
        names = tuple(name for name, _ in injection.headers)
        said = f"site answered 304 to {' and '.join(names)}; stored body served"
        self._injections.put((id(entry), request_fields), (entry, injection, fields, names, said))
        return injection, fields, names, said

    # -- response: 304 -> 200, unchanged, store and fingerprint ------------------------------

    def response(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        # Synchronous on the common paths (a 304 merged into the stored 200, a small 200
        # stored): a coroutine only to fetch again or to work on a large body in a thread.
        if flow.response is None or self.rt.store is None or flow.request.method != "GET":
            return None
        notes = notes_of(flow)
        if notes.local:
            return None
        injected: Injected | None = flow.metadata.pop(_INJECTED, None)
        try:
            pending = self._answered(flow, notes, injected)
        except Exception as e:  # noqa: BLE001
            self._answer_fault(flow, injected, e)
            return None
        if pending is None:
            return None
        return self._answered_rest(flow, injected, pending)

    def _answered(self, flow: http.HTTPFlow, notes: FlowNotes, injected: Injected | None) -> Awaitable[None] | None:
        assert flow.response is not None and self.rt.store is not None
        status = flow.response.status_code
        if status == 304 and injected is not None:
            return self._not_modified(flow, notes, injected)
        if status == 304:
            notes.outcome = "unchanged"
            notes.reason = "site answered 304 to the client's own conditional request"
        elif status == 200:
            return self._fetched(flow, notes)
        elif status in (404, 410) and flow.metadata.get(_HAD_ENTRY):
            key = store_key(flow, self.rt, self.rules)
            if key is not None:
                self.rt.store.forget(key)  # never serve a page the site says is gone
        return None

    async def _answered_rest(self, flow: http.HTTPFlow, injected: Injected | None, pending: Awaitable[None]) -> None:
        try:
            await pending
        except Exception as e:  # noqa: BLE001 - as in response()
            self._answer_fault(flow, injected, e)

    @staticmethod
    def _answer_fault(flow: http.HTTPFlow, injected: Injected | None, e: Exception) -> None:
        assert flow.response is not None
        if injected is not None and flow.response.status_code == 304:
            # The client did not ask conditionally: it must never see this 304.
            fail_closed(flow, "revalidation", e)
        else:
            log.exception("revalidation bookkeeping failed on %s", flow.request.url)

    def _not_modified(self, flow: http.HTTPFlow, notes: FlowNotes, injected: Injected) -> Awaitable[None] | None:
        assert flow.response is not None and self.rt.store is not None
        now = wall()
        entry = injected.entry
        kept = self._merges.get((id(entry), flow.response.headers.fields))
        if kept is None or kept[0] is not entry:
            merged = answer_304(entry, site_headers(flow.response), now)
            fields = stored_fields(merged.headers, entry.body_size) if merged.usable else ()
            kept = self._merges.put((id(entry), flow.response.headers.fields), (entry, merged, fields))
        _, answer, fields = kept
        if not answer.usable or answer.entry is None:
            return self._ask_again(flow, notes, injected, answer.reason)
        # Written less than a minute ago, same validators: the client gets the merged headers;
        # the row is not rewritten for each repeat (variants.py REFRESH_EVERY_S says why).
        write = rewrite_after_304(entry, answer.entry, now)
        if write:  # the refreshed entry, stored now, from the site's 304 headers
            answer = answer_304(entry, site_headers(flow.response), now)
        # The same site headers on the same entry merge to the same 200 (RFC 9111 §4.3.4); the
        # body is the entry's (store.body() checked its size and SHA-256).
        set_stored_fields(flow.response, injected.body, fields)
        notes.outcome = "revalidated"
        notes.reason = injected.said
        notes.extra["changed"] = False
        if not write or answer.entry is None:
            # The schedule is not rewritten, but the sitemap learns this check happened (a
            # moved lastmod is answered: the URL is not due again for it).
            key = store_key(flow, self.rt, self.rules)
            if self.sitemaps is not None and key is not None:
                self.sitemaps.checked(notes.site, key, None, False, read_before=True)
            return None
        # Written back only while the store still holds this body (RFC 9111 §4.3.4 updates the
        # stored response; one that was replaced or evicted meanwhile is not ours to touch).
        # The new revisit schedule goes into the same row, in the same write.
        revisit = self._revisit(flow, notes, None, now)
        if not self.rt.store.refresh(answer.entry, {REVISIT: revisit}):
            self.rt.store.put_record(REVISIT, answer.entry.url, revisit)
        return None

    async def _ask_again(self, flow: http.HTTPFlow, notes: FlowNotes, injected: Injected, why: str) -> None:
        if await _fetched_again(self.rt, flow, notes, injected, why):
            pending = self._fetched(flow, notes)
            if pending is not None:
                await pending

    def _fetched(self, flow: http.HTTPFlow, notes: FlowNotes) -> Awaitable[None] | None:
        """A 200 stored and fingerprinted: None when done at once, else the coroutine doing the
        work of a body over THREAD_ABOVE in a worker thread."""
        response = flow.response
        store = self.rt.store
        assert response is not None and store is not None
        key = store_key(flow, self.rt, self.rules)
        if key is None:
            return None
        if response.raw_content is None:
            copy = body_of(flow)
            if copy is not None and copy.sha256 is not None:
                self._fetched_unkept(flow, notes, key, copy.sha256)
            return None
        raw = response.raw_content
        request_headers = decoded(flow.request.headers.fields)
        response_headers = site_headers(response)
        now = wall()
        decision = should_store_pairs("GET", 200, request_headers, response_headers, len(raw), store.max_body)
        rules = self.rules.get(self.rt.config, notes.site)
        fingerprinter = rules.fingerprinter

        def work() -> tuple[dict[str, Any] | None, StoredEntry | None]:
            # The stored entry and its schedule come from one row: the schedule's fingerprint
            # is that of the entry's body (put() writes them together; a 304 keeps both).
            current, state = store.get_with_record(key, REVISIT, parse=RevisitState.from_state)
            # The same bytes as the stored body the store keeps in memory: its SHA-256, compared
            # rather than hashed again (a page fetched again unchanged, most re-fetches).
            sha = store.known_sha256(current, raw) or hashlib.sha256(raw).hexdigest()
            encoding = first_field(response_headers, "content-encoding")
            same_body = (current is not None and current.body_sha256 == sha and current.body_size == len(raw)
                         and first_field(current.headers, "content-encoding") == encoding)
            if same_body and state is not None and state.fingerprint is not None and len(raw) <= store.max_body:
                digest = state.fingerprint  # byte-identical body: the same fingerprint, no regex passes
            else:
                digest = body_digest(raw, encoding, fingerprinter, store.max_body)
            recent = decision.store and current is not None and same_body and written_lately(current, now)
            # Told from the headers when the site sends no Vary; else from the built entry.
            unchanged = recent and current is not None and _same_variant_as(current, request_headers, response_headers)
            entry = None
            if decision.store and unchanged is not True:
                entry = StoredEntry.build(key, request_headers, response_headers, raw, now, body_sha256=sha)
                unchanged = recent and current is not None and _same_variant(current, entry)
            if unchanged:
                # The same body, validators, Vary values and credentials stored less than a
                # minute ago: as after a 304 (_not_modified), the row is not rewritten for
                # each repeat (other headers, e.g. Date, are stored with the next write), nor
                # is a new schedule worked out: only whether the page changed is told.
                self._told(notes, key, state, fetch_changed(state, digest))
                return None, current
            revisit = self._revisit(flow, notes, digest, now, state)
            # Body, entry and revisit schedule in one write (the schedule rides in the row). A
            # body the store holds already is not written again: only the entry row is, and
            # the body row counts a use (refresh), unless the store changed meanwhile.
            if entry is not None and not (same_body and store.refresh(entry, {REVISIT: revisit})) \
                    and not store.put(entry, raw, {REVISIT: revisit}, hashed=True):
                entry = None
            return revisit, entry

        if len(raw) > THREAD_ABOVE:
            return self._fetched_in_thread(flow, notes, key, decision.reason, response_headers, work)
        self._fetched_kept(flow, notes, key, decision.reason, response_headers, *work())
        return None

    async def _fetched_in_thread(self, flow: http.HTTPFlow, notes: FlowNotes, key: str, why: str,
                                 response_headers: HeaderPairs,
                                 work: Callable[[], tuple[dict[str, Any] | None, StoredEntry | None]]) -> None:
        revisit, entry = await asyncio.to_thread(work)
        self._fetched_kept(flow, notes, key, why, response_headers, revisit, entry)

    def _fetched_kept(self, flow: http.HTTPFlow, notes: FlowNotes, key: str, why: str,
                      response_headers: HeaderPairs, revisit: dict[str, Any] | None,
                      entry: StoredEntry | None) -> None:
        """What follows the store's work on a 200: an outdated copy forgotten, the schedule of
        a page not stored written on its own."""
        store = self.rt.store
        assert store is not None
        if entry is None and flow.metadata.get(_HAD_ENTRY):
            store.forget(key)  # the stored copy is outdated and the new one is not storable
        if entry is None:
            log.debug("%s not stored: %s", key, why)
            assert revisit is not None  # worked out whenever no entry is kept
            store.put_record(REVISIT, key, revisit)

        _note_would_revalidate(flow, notes, response_headers)

    def _fetched_unkept(self, flow: http.HTTPFlow, notes: FlowNotes, key: str, sha256: str) -> None:
        """A 200 whose body streamed past store.max_body (streaming.py): never stored, so no
        validators are injected for it later (a 304 could not be turned into the page); its
        fingerprint is the SHA-256 computed on the stream, as `body_digest` takes for any body
        above store.max_body, so the revisit schedule still learns whether it changed."""
        store = self.rt.store
        assert store is not None
        revisit = self._revisit(flow, notes, "raw:" + sha256, wall())
        if flow.metadata.get(_HAD_ENTRY):
            store.forget(key)  # the stored copy is outdated and the new one is not storable
        store.put_record(REVISIT, key, revisit)
        assert flow.response is not None
        _note_would_revalidate(flow, notes, site_headers(flow.response))

    def _revisit(self, flow: http.HTTPFlow, notes: FlowNotes, digest: str | None,
                 now: float, state: RevisitState | None | bool = False) -> dict[str, Any]:
        """The new revisit schedule after a 200 (digest) or a 304 to our validators (None), to
        be written by the caller with the entry; sets `changed` on the notes."""
        store = self.rt.store
        key = store_key(flow, self.rt, self.rules)
        assert store is not None and key is not None
        policy = self.rules.get(self.rt.config, notes.site).revisit
        if state is False:  # not read by the caller
            state = store.get_record(REVISIT, key, parse=RevisitState.from_state)
        assert state is None or isinstance(state, RevisitState)
        if digest is None:
            revisit = policy.after_not_modified(state, now)
        else:
            revisit = policy.after_fetch(state, digest, now)
        self._told(notes, key, state, revisit.changed)
        return revisit.state.to_state()

    def _told(self, notes: FlowNotes, key: str, state: RevisitState | None, changed: bool | None) -> None:
        """A fetch of `key` found the page `changed` (None: nothing to compare with): into the
        audit line, and to the sitemap's lastmod score."""
        if changed is not None:
            notes.extra["changed"] = changed
        if self.sitemaps is not None:
            self.sitemaps.checked(notes.site, key, state, changed)


async def _fetched_again(rt: Runtime, flow: http.HTTPFlow, notes: FlowNotes, injected: Injected, why: str) -> bool:
    """A 304 naming another validator says nothing about our body (RFC 9111 §4.3.4): ask
    again without validators, so the client gets the current page, never a 304. True when the
    answer is a 200 (to be stored and fingerprinted as any other)."""
    assert flow.response is not None and rt.store is not None
    dropped = {n.lower() for n in injected.names} | _HOP_BY_HOP | {"host", "accept-encoding"}
    headers = {k: v for k, v in flow.request.headers.items() if k.lower() not in dropped}
    limit = DECODE_FACTOR * max(rt.store.max_body, 1024**2)
    try:
        side = await fetch(flow.request.url, path=rt.upstream, headers=headers,
                           timeout=REFETCH_TIMEOUT_S, max_bytes=limit)
    except SideFetchError as e:
        answer_locally(flow, 502, "failed", f"{why}; fetching again without validators failed: {e}")
        return False
    if side.truncated or side.status == 304:
        answer_locally(flow, 502, "failed", f"{why}; the second answer was unusable "
                                            f"({side.status}{', too large' if side.truncated else ''})")
        return False
    response = flow.response
    response.status_code = side.status
    response.reason = ""
    # side_fetch has already undone gzip/deflate: the body goes out (and is stored) plain.
    response.headers = http.Headers([
        (k.encode("utf-8", "surrogateescape"), v.encode("utf-8", "surrogateescape"))
        for k, v in side.headers if k.lower() not in _HOP_BY_HOP])
    response.raw_content = side.body
    response.headers["Content-Length"] = str(len(side.body))
    notes.upstream_status = side.status
    notes.extra.pop("injected", None)
    notes.reason = f"{why}; fetched again without validators"
    return side.status == 200


def _note_would_revalidate(flow: http.HTTPFlow, notes: FlowNotes, response_headers: HeaderPairs) -> None:
    """Observe mode: the site's 200 carried the validators we would have sent."""
    would: StoredEntry | None = flow.metadata.get(_WOULD_INJECT)
    if would is not None and _same_validators(would, response_headers):
        notes.would_do("revalidated", "the site's 200 carries the stored validators: "
                                      "with them injected it would have answered 304")
