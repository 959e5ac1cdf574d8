"""Gone memory: a URL the site answered 410 or 404 is answered locally for a while (SPEC §6).

The record lives in the validator store (namespace `gone`, keyed by the normalised URL), so it
survives restarts and shares the store's size limit. A later 2xx or 304 for the URL clears it.

With `state.backend: redis` (SPEC §10) every record kept or cleared is also written to Redis,
with the same expiry, before the response goes on, and announced: every other instance puts it
into its own store as it arrives (and reads Redis's records back on every (re)connect), so the
check itself stays a local read. Redis unreachable: each instance keeps what it has; gone
memory only ever answers locally, it never lets a request through that pacing would not.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

from addons.answers import answer_locally, fail_closed
from addons.notes import notes_of, skip
from addons.runtime import Runtime
from addons.store_keys import store_key
from mitmproxy import http

from etiquette_proxy.clock import wall
from etiquette_proxy.revalidation.gone import NAMESPACE, GonePolicy, GoneRecord
from etiquette_proxy.revalidation.site_rules import BySite, StoreRules
from etiquette_proxy.state.redis_store import RedisShared, SharedStateUnavailable

log = logging.getLogger(__name__)

# flow.metadata: the URL had a gone record when the request went out (so a 2xx must clear it).
_HAD_RECORD = "etiquette_gone_record"


class GoneMemory:
    def __init__(self, runtime: Runtime):
        self.rt = runtime
        # gone.ttl_410 / ttl_404 per site, read once per site and config (site_rules.py)
        self.rules: BySite[StoreRules] = BySite(StoreRules.from_config)
        self._follower: asyncio.Task[None] | None = None

    def running(self) -> None:
        if self.rt.shared is not None and self._follower is None:
            self._follower = asyncio.ensure_future(self.rt.shared.follow_records(NAMESPACE, self._learn))

    def done(self) -> None:
        if self._follower is not None:
            self._follower.cancel()
            self._follower = None

    def _learn(self, key: str, state: Any | None, ttl_s: float) -> None:
        """A record another instance kept (or cleared): into this instance's store."""
        store = self.rt.store
        if store is None:
            return
        try:
            if state is None:
                store.forget_record(NAMESPACE, key)
            else:
                GoneRecord.from_state(state)  # a value that is not a record never lands
                store.put_record(NAMESPACE, key, state, ttl_s=ttl_s)
        except ValueError as e:
            log.warning("shared gone record for %s ignored: %s", key, e)
        except Exception:  # noqa: BLE001 - a saving, not a permission
            log.exception("gone memory could not take the shared record for %s", key)

    def request(self, flow: http.HTTPFlow) -> None:
        if skip(flow) or self.rt.store is None:
            return
        if flow.request.method not in ("GET", "HEAD"):
            return  # GonePolicy answers only these; skip the store read for the rest
        try:
            self._check(flow)
        except Exception as e:  # noqa: BLE001
            # A gate (SPEC §3 `gone`): a URL the site said is gone is not asked again because
            # the memory of it could not be read (SPEC §12: fail closed).
            fail_closed(flow, "gone memory", e)

    def _check(self, flow: http.HTTPFlow) -> None:
        notes = notes_of(flow)
        key = store_key(flow, self.rt, self.rules)
        if key is None:
            return
        assert self.rt.store is not None
        record = self.rt.store.get_record(NAMESPACE, key, parse=GoneRecord.from_state)
        if record is None:
            return
        flow.metadata[_HAD_RECORD] = True
        decision = self.rules.get(self.rt.config, notes.site).gone.check(flow.request.method, record, wall())
        if not decision.gone:
            return
        assert decision.status is not None
        if self.rt.observe:
            notes.would_do("gone", decision.reason)
            notes.extra["gone_status"] = decision.status
            return
        answer_locally(flow, decision.status, "gone", decision.reason)

    def response(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        """Keep or clear the URL's record; with Redis, an awaitable that shares the change (the
        chain awaits it, so every instance knows before this client hears the answer)."""
        if flow.response is None or self.rt.store is None or notes_of(flow).local:
            return None
        try:
            change = self._remember(flow, flow.response.status_code)
        except Exception:  # noqa: BLE001 - bookkeeping only; the response goes out as it is
            log.exception("gone memory could not record %s", flow.request.url)
            return None
        if change is None or self.rt.shared is None:
            return None
        return self._share(self.rt.shared, *change)

    @staticmethod
    async def _share(shared: RedisShared, key: str, state: dict[str, Any] | None, ttl_s: float) -> None:
        try:
            if state is None:
                await shared.forget_record(NAMESPACE, key)
            else:
                await shared.put_record(NAMESPACE, key, state, ttl_s)
        except SharedStateUnavailable:
            pass  # said once in the log by the store; this instance remembers it still

    def _remember(self, flow: http.HTTPFlow, status: int) -> tuple[str, dict[str, Any] | None, float] | None:
        """Keep or clear the URL's record; what changed (key, record or None, ttl), if anything."""
        assert self.rt.store is not None
        if status in (404, 410):
            key = store_key(flow, self.rt, self.rules)
            policy = self.rules.get(self.rt.config, notes_of(flow).site).gone
            assert flow.response is not None
            headers = flow.response.headers
            # RFC 9111 §4.2: the site's own freshness bounds what is remembered (every value of
            # a repeated field, comma-joined).
            stated = {name: ", ".join(headers.get_all(name))
                      for name in ("cache-control", "expires", "date", "age") if name in headers}
            record = policy.remember(flow.request.method, status, wall(), stated)
            if key is not None and record is not None:
                # The TTL only lets diskcache clean up; GonePolicy.check decides with the TTL
                # in force (a record keeps when it was seen, not when it ends).
                ttl_s = policy.record_ttl(record)
                self.rt.store.put_record(NAMESPACE, key, record.to_state(), ttl_s=ttl_s)
                return key, record.to_state(), ttl_s
            if key is not None and flow.metadata.get(_HAD_RECORD):
                self.rt.store.forget_record(NAMESPACE, key)  # an older record must not outlive this answer
                return key, None, 0.0
        elif flow.metadata.get(_HAD_RECORD) and (GonePolicy.clears(status) or status == 304):
            # A 304 also says the URL exists (it answers our or the client's validators).
            key = store_key(flow, self.rt, self.rules)
            if key is not None:
                self.rt.store.forget_record(NAMESPACE, key)
                return key, None, 0.0
        return None
