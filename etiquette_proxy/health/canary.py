"""Canaries (SPEC §8): configured stable URLs per site with an expected marker, fetched on a
schedule through the same upstream path as the crawl; a canary that returns a normal-looking
page with the wrong content is the strongest signal.

A canary is a request to the site like any other: it obeys robots.txt (RFC 9309), is signed
(SPEC §9: the fetch callable does that), waits while the audit log cannot be written (SPEC §11)
and writes its own audit line (`canary: true`, `marker_found`). It bypasses pacing's pause on
purpose: a paused site keeps only its canaries, which is how it leaves the pause by probation.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from etiquette_proxy.audit.log import audit_record
from etiquette_proxy.clock import wall
from etiquette_proxy.health.bands import BandChange
from etiquette_proxy.health.signals import HEAD_BYTES, Signal
from etiquette_proxy.health.site import SiteHealth
from etiquette_proxy.site_key import SiteKeys

if TYPE_CHECKING:  # the service drives the canaries; it imports this module at run time
    from etiquette_proxy.health.service import HealthService

log = logging.getLogger(__name__)

CANARY_TIMEOUT_S = 15.0
CANARY_MAX_BYTES = 2 * 1024 * 1024  # the marker may sit anywhere in a normal page
_OK = Signal.OK


class FetchFailed(Exception):
    """The side fetch got no answer (refused, reset, timed out, TLS); the message says why."""


class Fetched(Protocol):
    """What a side fetch answers: status, body (at most max_bytes) and header fields."""

    @property
    def status(self) -> int: ...

    @property
    def body(self) -> bytes: ...

    @property
    def headers(self) -> Iterable[tuple[str, str]]: ...


# (url, headers, timeout_s, max_bytes) -> the answer; raises FetchFailed
SideFetch = Callable[[str, dict[str, str], float, int], Awaitable[Fetched]]
# (url, site, client user agent, use the last copy) -> allowed by robots.txt
RobotsAllows = Callable[[str, str, str, bool], Awaitable[bool]]


def canaries_of(config: Any, keys: SiteKeys | None = None) -> list[tuple[str, str, str]]:
    """(site, url, marker) for every configured canary, top-level and per-site, once each; the
    site is the key the canary's own requests get under `pacing.group_by` (`keys`)."""
    keys = keys or SiteKeys(config.get("pacing.group_by"), config.get("pacing.address_ttl"))
    lists: list[Iterable[dict[str, str]]] = [config.values.get("health.canaries", ())]
    lists += [o.get("health.canaries", ()) for o in config.sites.values()]
    seen: set[tuple[str, str]] = set()
    out = []
    for items in lists:
        for c in items:
            key = (c["url"], c["marker"])
            if key in seen:
                continue
            seen.add(key)
            try:
                out.append((keys.of_url(c["url"]), c["url"], c["marker"]))
            except ValueError:
                log.warning("health: canary %r is not an http(s) URL; skipped", c["url"])
    return out


class Canaries:
    """Fetches each canary on its schedule and counts what came back into the site's health."""

    def __init__(self, service: HealthService, fetch: SideFetch | None,
                 robots_allows: RobotsAllows | None):
        self.service = service
        self._fetch = fetch
        # RobotsGate.allows in the product: canaries obey robots.txt like everything else.
        self.robots_allows = robots_allows

    async def loop(self, site: str, url: str, marker: str) -> None:
        """One canary, every `health.canary_interval` of its site, until cancelled."""
        service = self.service
        while True:
            try:
                await self.run(site, url, marker)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - one broken canary must not stop the schedule
                log.exception("health: canary %s failed unexpectedly", url)
            await service.sleep(float(service.rt.config.get("health.canary_interval", site)))

    async def run(self, site: str, url: str, marker: str) -> None:
        """Fetch one canary through the same upstream path; bypasses pacing's pause on purpose."""
        service = self.service
        rt = service.rt
        if rt.audit is not None and rt.audit.refusal() is not None:
            return  # SPEC §11: nothing leaves while its line cannot be written; the next round
        ua = rt.config.identity.user_agent or "etiquette-proxy-canary"
        if self.robots_allows is not None:
            try:
                async with asyncio.timeout(CANARY_TIMEOUT_S):
                    allowed = await self.allows(site, url, ua)
            except TimeoutError:
                log.warning("health: robots.txt for canary %s not known in time; skipped this round", url)
                return
            if not allowed:
                self._line(url, site, ua, "disallowed", None, "canary disallowed by robots.txt",
                           None, service._health(site))
                return
        if self._fetch is None:
            return  # no way out to the site (a core test without one)
        h = service._site(site, f"{urlsplit(url).scheme.lower()}://{site}")
        route = service._route()
        monotonic = service.monotonic
        sent = monotonic()
        try:
            response = await self._fetch(url, {"User-Agent": ua}, CANARY_TIMEOUT_S, CANARY_MAX_BYTES)
        except FetchFailed as e:
            observed = h.observe_error(str(e), monotonic() - sent, route=route)
            fields = self._counted(site, h, [observed.change, h.record_canary(url, 0, False)])
            self._line(url, site, ua, "failed", None, f"canary: {e}", False, h, fields)
            return
        latency = monotonic() - sent
        found = marker.lower().encode() in response.body.lower()
        headers = {k.lower(): v for k, v in response.headers}
        observed = h.observe_response(response.status, headers, response.body[:HEAD_BYTES],
                                      len(response.body), latency, route=route)
        fields = self._counted(site, h, [observed.change, h.record_canary(url, response.status, found)])
        if observed.signal.signal is not _OK:
            fields["health_signal"] = observed.signal.signal.value
        outcome = "refused" if response.status >= 400 else "fetched"
        reason = f"canary: marker {marker!r} {'found' if found else 'missing'}"
        self._line(url, site, ua, outcome, response.status, reason, found, h, fields)

    def _counted(self, site: str, h: SiteHealth, changes: list[BandChange | None]) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        self.service._after(site, h, changes, fields, closed=self.service.book.counted(site, h))
        return fields

    async def allows(self, site: str, url: str, ua: str) -> bool:
        """Whether robots.txt lets the canary be fetched now."""
        assert self.robots_allows is not None
        # Refreshing robots.txt takes a turn of the site's budget, which a health pause
        # refuses; while paused the canary is checked against the last copy instead, or a
        # pause longer than the robots cache would turn every canary away for good.
        return await self.robots_allows(url, site, ua, self.service._health(site).is_paused())

    def _line(self, url: str, site: str, ua: str, outcome: str, status: int | None,
              reason: str, found: bool | None, h: SiteHealth,
              fields: dict[str, Any] | None = None) -> None:
        rt = self.service.rt
        if rt.audit is None:
            return
        extra = dict(fields) if fields is not None else {}
        try:
            rt.record(audit_record(
                ts=wall(), outcome=outcome, method="GET", url=url, site=site, status=status,
                upstream_status=status, waited_s=0.0, rate=self.service.rates.of(site), reason=reason,
                client_ua=ua, canary=True, marker_found=found,
                signed=rt.signed_keyid() if status is not None else None, **extra,
            ))
        except Exception:  # noqa: BLE001
            log.exception("health: could not write the canary line for %s", url)
