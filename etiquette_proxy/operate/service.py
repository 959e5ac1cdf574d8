"""The operator's pauses and actions on a running proxy (SPEC §3 `etiquette-proxy sites`).

The command line POSTs `{"action", "site", "for_s"}` to `http://etiquette.proxy/operator`
through the proxy itself (controls.py: the guard and the files that let it find the proxy).
Each action is one audit line with `event: operator`.

- pause: the site's requests are answered locally 503 `paused` (`answer_for`) until resumed or
  `for_s` runs out; kept in the state store, so a restart keeps it.
- resume: lifts the operator's pause and a health pause (SPEC §8: "a human decision"). A pause
  or breaker the site asked for itself (429, Retry-After) stays: SPEC §5, not one request
  inside a pause the site asked for.
- forget: lifts the operator's pause, drops what health learned (windows, baseline, band)
  and the limit the site taught pacing (learned rate, ceiling, concurrency: SPEC §5); the
  pauses and breaker the site asked for stay for the same reason.

With `state.backend: redis` (SPEC §10) a pause taken through any instance holds on all: it is
written to Redis (on the server's clock) before the answer goes back to the command line
(`settled`), the shared reservation refuses the site's requests on every instance from then
on, and each instance refreshes its own view from Redis every REFRESH_S. An action taken while
Redis is away holds here at once and is shared, in order, once Redis is back: never lost.

No mitmproxy: the addon (addons/controls.py) hands in the site of a flow and acts on the answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from etiquette_proxy.audit.log import audit_record
from etiquette_proxy.clock import Clock, wall
from etiquette_proxy.operate.controls import (
    ROUTE,
    TOKEN_ENV,
    TOKEN_FILE,
    URL_FILE,
    Action,
    GuardError,
    OperatorPauses,
    check_post,
    new_token,
    parse_action,
    reachable_url,
    site_matches,
    write_private,
)
from etiquette_proxy.pacing.rates import Rates
from etiquette_proxy.state.interface import StateStore, save
from etiquette_proxy.state.redis_store import RedisShared, SharedStateUnavailable
from etiquette_proxy.visibility.page import Page, human_seconds

log = logging.getLogger(__name__)

NAMESPACE = "operator"
PAUSED_RETRY_S = 60  # Retry-After for an open-ended operator pause
REFRESH_S = 1.0      # how often an instance reads the shared pauses (state.backend: redis)


class OperatorHost(Protocol):
    """What the service reads of the running proxy (the addon layer's Runtime): the state
    store and the shared one (both replaced when the config is loaded again), the state dir,
    and the audit log."""

    state: StateStore
    shared: RedisShared | None
    state_dir: str

    def record(self, record: Mapping[str, Any], hold: bool = True) -> None: ...


class SiteAsked(Protocol):
    """Pacing, as the controls see it: what the sites asked for themselves (SPEC §5)."""

    def site_asked(self, asked: str) -> list[str]: ...
    def forget_learned(self, asked: str) -> list[str]: ...


class HealthActions(Protocol):
    """Health, as the controls see it: the sites it knows; resume and forget (SPEC §8)."""

    def sites(self) -> Iterable[str]: ...
    def resume(self, site: str, why: str) -> bool: ...
    def forget(self, site: str) -> bool: ...


@dataclass(frozen=True)
class PauseAnswer:
    """A request to a site the operator paused: answered locally 503 `paused`."""

    reason: str
    retry_after_s: int


def json_page(status: int, payload: dict[str, Any]) -> Page:
    return Page(status, "application/json", (json.dumps(payload) + "\n").encode(), (("Cache-Control", "no-store"),))


def not_shared_answer(content: bytes, why: str) -> bytes | None:
    """The action's answer, saying it holds here but is not shared yet; None if not JSON."""
    try:
        answer = json.loads(content or b"{}")
        answer["not_shared"] = why
        answer["reason"] = (f"{answer.get('reason', '')}; not shared yet ({why}): holds on this proxy "
                            f"now, on every proxy once Redis is back")
    except (ValueError, TypeError):
        return None
    return (json.dumps(answer) + "\n").encode()


class OperatorService:
    """The operator's pauses (held, persisted, shared), the endpoint's actions, their audit lines."""

    def __init__(self, host: OperatorHost, rates: Rates, pacing: SiteAsked | None = None,
                 health: HealthActions | None = None, clock: Clock = wall,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep):
        self.host = host
        self.rates = rates
        self.pacing = pacing  # the site's own pause and breaker, to say what stays
        self.health = health  # resume and forget
        self._clock = clock
        self._sleep = sleep
        self.pauses = OperatorPauses(clock)
        self.token: str | None = None
        self._url_file: str | None = None
        self._url = ""
        self._loaded_from: object = None
        self._sharing: set[asyncio.Task[None]] = set()  # actions on their way to Redis
        self._shared_down: str | None = None  # why the last action could not be shared
        self._unshared: list[Action] = []  # taken while Redis was away: shared once it is back
        self._refresher: asyncio.Task[None] | None = None
        self._actions_seen: str | None = None  # the shared action stream, read up to here

    # -- lifecycle --------------------------------------------------------------------------

    def restore(self) -> None:
        """Read the pauses back from the state store, once per store (a reload opens a new one)."""
        if self._loaded_from is self.host.state:
            return
        self._loaded_from = self.host.state
        self.pauses = OperatorPauses(self._clock)
        try:
            self.pauses.from_state(self.host.state.get(NAMESPACE, "pauses"))
        except Exception:  # noqa: BLE001 - unreadable state must not stop the proxy
            log.exception("operator: stored pauses unreadable; starting without")

    def _save(self) -> None:
        save(self.host.state, NAMESPACE, "pauses", self.pauses.to_state(), "operator pauses")

    def announce(self, address: tuple[str, int]) -> None:
        """Listening: write the token and the URL into the state dir (0600), for the CLI."""
        host, port = address
        self.restore()
        directory = self.host.state_dir
        if not directory:
            return
        shared = os.environ.get(TOKEN_ENV)
        if shared:  # a worker of `run --workers N`: its supervisor's token and files (SPEC §3)
            self.token = shared
            return
        self.token = new_token()
        self._url = reachable_url(host, port)
        try:
            write_private(os.path.join(directory, TOKEN_FILE), self.token + "\n")
            self._url_file = os.path.join(directory, URL_FILE)
            write_private(self._url_file, self._url + "\n")
        except OSError as e:
            log.warning("operator: could not write %s: %s (`etiquette-proxy sites` will not find this proxy)",
                        directory, e)

    def start(self) -> None:
        """On the running loop: follow the shared pauses (state.backend: redis)."""
        if self.host.shared is not None and self._refresher is None:
            self._refresher = asyncio.ensure_future(self._refresh_loop())

    def stop(self) -> None:
        """Stopping: the URL goes, unless another proxy has written its own since."""
        if self._refresher is not None:
            self._refresher.cancel()
            self._refresher = None
        if self._url_file is None:
            return
        try:
            with open(self._url_file, encoding="ascii") as f:
                mine = f.read().strip() == self._url
            if mine:
                os.unlink(self._url_file)
        except OSError:
            pass

    # -- the shared view (SPEC §10) ---------------------------------------------------------

    async def _refresh_loop(self) -> None:
        while True:
            await self.refresh()
            await self._sleep(REFRESH_S)

    async def refresh(self) -> None:
        """Take the shared pauses as this instance's own (Redis unreachable: keep what is held,
        the shared reservation fails closed meanwhile)."""
        shared = self.host.shared
        if shared is None or self._sharing:
            return
        self.restore()
        try:
            if not await self._share_unshared():
                return  # Redis still away: this instance's own view holds meanwhile
            pauses = await shared.operator_pauses()
        except SharedStateUnavailable:
            return
        if not self._sharing:  # else an action taken meanwhile is newer than what was read
            self.pauses.replace({site: None if left is None else self._clock() + left
                                 for site, left in pauses.items()})
        try:
            self._actions_seen, actions = await shared.actions_since(self._actions_seen)
        except SharedStateUnavailable:
            return
        for action, site in actions:  # resumed or forgotten through another instance
            if action == "forget" and self.pacing is not None:
                self.pacing.forget_learned(site)
            for known in self._health_sites(site):
                assert self.health is not None
                if action == "resume":
                    self.health.resume(known, "resumed by operator (through another proxy)")
                else:
                    self.health.forget(known)

    @property
    def sharing(self) -> bool:
        """An action is on its way to Redis."""
        return bool(self._sharing)

    async def settled(self) -> str | None:
        """Wait for the actions on their way to Redis; why the last could not be shared, or None."""
        await asyncio.gather(*list(self._sharing), return_exceptions=True)
        why, self._shared_down = self._shared_down, None
        return why

    def _share(self, action: Action) -> None:
        """Send the action to Redis in the background (the answer waits for it: `settled`)."""
        async def run() -> None:
            if self._unshared:  # in order, after those still waiting for Redis
                self._unshared.append(action)
                self._shared_down = "earlier actions still wait for Redis"
                return
            try:
                await self._shared_action(action)
            except SharedStateUnavailable as e:
                self._shared_down = str(e)
                self._unshared.append(action)  # never lost: a pause must not lapse (SPEC §10)
        task = asyncio.ensure_future(run())
        self._sharing.add(task)
        task.add_done_callback(self._sharing.discard)

    async def _shared_action(self, action: Action) -> None:
        shared = self.host.shared
        if shared is None:
            return
        if action.action == "pause":
            await shared.pause_site(action.site, action.for_s)
        else:
            await shared.resume_site(action.site)
            await shared.announce_action(action.action, action.site)

    async def _share_unshared(self) -> bool:
        """Actions taken while Redis was away, in order; False while it still is."""
        while self._unshared:
            action = self._unshared[0]
            try:
                await self._shared_action(action)
            except SharedStateUnavailable:
                return False
            self._unshared.pop(0)
            log.warning("operator: %s %s shared with every proxy now that Redis is back", action.action, action.site)
        return True

    # -- questions --------------------------------------------------------------------------

    def answer_for(self, site: str) -> PauseAnswer | None:
        """How a request to `site` is answered while the operator has it paused; None: not paused."""
        self.restore()
        left = self.pauses.left_s(site)
        if left is None:
            return None
        if math.isinf(left):
            return PauseAnswer("paused by the operator (etiquette-proxy sites resume to lift)", PAUSED_RETRY_S)
        return PauseAnswer(f"paused by the operator for {human_seconds(left)} more", max(1, math.ceil(left)))

    def status(self, site: str) -> dict[str, Any]:
        """Dashboard fields: `operator_pause_s` (-1 when open-ended)."""
        left = self.pauses.left_s(site)
        if left is None:
            return {}
        return {"operator_pause_s": -1 if math.isinf(left) else round(left, 1)}

    # -- the endpoint -----------------------------------------------------------------------

    def post(self, body: bytes, headers: Any) -> Page:
        try:
            check_post(headers, self.token or "")
            action = parse_action(body)
        except GuardError as e:
            return json_page(e.status, {"error": str(e)})
        except ValueError as e:
            return json_page(400, {"error": str(e)})
        try:
            result = self.act(action)
        except Exception as e:  # noqa: BLE001 - a failed action never takes the proxy down
            log.exception("operator: %s %s failed", action.action, action.site)
            return json_page(500, {"error": f"internal error: {type(e).__name__}"})
        return json_page(200, result)

    def act(self, action: Action) -> dict[str, Any]:
        """Do one action; the audit line and the answer say what changed and what stays."""
        self.restore()
        site = action.site
        done: list[str] = []
        shared = self.host.shared
        if action.action == "pause":
            self.pauses.pause(site, action.for_s)
            done.append("paused" + (f" for {human_seconds(action.for_s)}" if action.for_s else " until resumed"))
            if shared is not None:
                self._share(action)
        else:
            if shared is not None:
                self._share(action)
            if self.pauses.resume(site):  # with Redis, the view refreshed from every instance
                done.append("operator pause lifted")
            for known in self._health_sites(site):
                assert self.health is not None
                if action.action == "resume" and self.health.resume(known, "resumed by operator"):
                    done.append(f"{known}: health pause lifted (half rate while it is judged again)")
                elif action.action == "forget" and self.health.forget(known):
                    done.append(f"{known}: health history forgotten")
            if action.action == "forget" and self.pacing is not None:
                done += self.pacing.forget_learned(site)  # SPEC §5: the learned limit too
        self._save()
        stays = self.pacing.site_asked(site) if self.pacing is not None else []  # SPEC §5 keeps them
        reason = f"operator {action.action} {site}: " + ("; ".join(done) or "nothing to do")
        if stays:
            reason += "; stays: " + "; ".join(stays)
        self._audit(action, reason)
        return {"action": action.action, "site": site, "done": done, "stays": stays, "reason": reason}

    def _health_sites(self, asked: str) -> list[str]:
        if self.health is None:
            return []
        return [s for s in self.health.sites() if site_matches(s, asked)]

    def _audit(self, action: Action, reason: str) -> None:
        site = action.site
        extra: dict[str, Any] = {"event": "operator", "action": action.action}
        if action.for_s is not None:
            extra["pause_s"] = action.for_s
        try:
            self.host.record(audit_record(
                ts=wall(), outcome="paused" if action.action == "pause" else "fetched", method="-",
                url=f"{ROUTE}#{action.action}", site=site, status=None, upstream_status=None, waited_s=0.0,
                rate=self.rates.of(site), reason=reason, client_ua=None, **extra,
            ))
        except Exception:  # noqa: BLE001
            log.exception("operator: could not write the audit line for %s %s", action.action, action.site)
