"""The addon chain, in mitmproxy's addon order: gates on the way out, the audit writer last."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from inspect import isawaitable
from types import CoroutineType
from typing import Any

from addons.answers import FAULTS, fail_closed
from addons.audit_log import AuditLogGate, AuditWriter
from addons.connections import ConnectionLimits, StopGate
from addons.controls import OperatorControls
from addons.dashboard import Dashboard
from addons.gone_memory import GoneMemory
from addons.health import REPORT_PATH, HealthWatch
from addons.identity import RequestSigning
from addons.pacing import Pacing
from addons.payments import PaidBodies, Payments
from addons.refusals import RefusalTrimmer
from addons.revalidation import Revalidation
from addons.robots_gate import RobotsGate
from addons.runaway import RunawayWatch
from addons.runtime import Runtime
from addons.settings import Settings
from addons.site_grouping import SiteGrouping
from addons.sitemaps import SitemapHooks
from addons.streaming import BodyDigests, BodyStreams, discard_request_body
from addons.target_check import TargetCheck

from etiquette_proxy.events import Broadcast
from etiquette_proxy.operate.controls import ROUTE as OPERATOR_ROUTE
from etiquette_proxy.pacing.restraints import Restraints
from etiquette_proxy.revalidation.sitemaps import sitemaps_in_robots

_GATED_AT_HEADERS = "etiquette_gated_at_headers"  # flow.metadata: the request hooks ran in requestheaders

# Hooks mitmproxy calls synchronously (errors, e.g. OptionsError, must reach it) and the
# asynchronous ones the members use.
SYNC_HOOKS = ("load", "configure")
# Hooks in which a member decides whether a request leaves: an exception there fails closed.
GATE_HOOKS = frozenset({"http_connect", "requestheaders", "request"})
ASYNC_HOOKS = ("running", "done", "client_connected", "client_disconnected", "server_connected",
               "server_disconnected", "tls_established_server", "http_connect", "requestheaders", "request", "responseheaders",
               "response", "error")


class Chain:
    """The etiquette addons as one mitmproxy addon, calling each member's hooks in order.

    mitmproxy invokes every addon for every event whether it has a hook or not, through a
    context manager per call (benchmarks/README.md: that dispatch, not our hook bodies, was
    most of the addon layer's cost). One addon that calls only the hooks its members define
    keeps one module per concern at a fraction of the cost. As in mitmproxy's own `safecall`,
    one member's exception never stops the chain; unlike it, an exception while a request is
    judged (GATE_HOOKS) answers that request 503 instead of letting it through (SPEC §12),
    and each kind of exception is logged once (`answers.FAULTS`), not once per flow.

    A flow's hooks are called without coroutine machinery for as long as they finish at once:
    mitmproxy awaits what an addon's hook returns only when it is awaitable (its own
    `invoke_addon`, and master.HookTable), so the chain's hook returns None when every member
    returned None, and otherwise a coroutine that awaits the member's awaitable and runs the
    members after it (`_run`). Most members' hooks are synchronous, and the gates whose work
    may wait (a robots.txt fetch, a name to resolve) return an awaitable only then.
    """

    def __init__(self, members: list[Any]):
        self.members = members
        self._hooks: dict[str, tuple[Callable[..., Any], ...]] = {
            name: tuple(getattr(m, name) for m in members if callable(getattr(m, name, None)))
            for name in SYNC_HOOKS + ASYNC_HOOKS
        }
        for name in ASYNC_HOOKS:
            if not self._hooks[name]:
                # mitmproxy skips an addon whose hook attribute is None: no call at all for
                # events no member listens to.
                setattr(self, name, None)

    def load(self, loader: Any) -> None:
        for hook in self._hooks["load"]:
            hook(loader)

    def configure(self, updated: set[str]) -> None:
        for hook in self._hooks["configure"]:
            hook(updated)

    def _run(self, name: str, arg: Any) -> Coroutine[Any, Any, None] | None:
        """Every member's `name` hook, in order: None when each returned without anything to
        await; else a coroutine that awaits the first awaitable and runs the rest. Every hook
        here takes one argument: `hook(arg)`, not `hook(*args)`, is a call CPython 3.11 makes
        without a C-level recursion (40 member hooks a request)."""
        hooks = self._hooks[name]
        for i, hook in enumerate(hooks):
            try:
                result = hook(arg)
            except Exception as e:  # noqa: BLE001 - one member's bug never takes the proxy down
                _fault(name, hook, (arg,), e)
                continue
            if result is not None and (type(result) is CoroutineType or isawaitable(result)):
                return _finish(name, hooks, i, result, (arg,))
        return None

    async def running(self) -> None:
        await _finish("running", self._hooks["running"], -1, None, ())

    async def done(self) -> None:
        await _finish("done", self._hooks["done"], -1, None, ())

    def client_connected(self, client: Any) -> Coroutine[Any, Any, None] | None:
        return self._run("client_connected", client)

    def client_disconnected(self, client: Any) -> Coroutine[Any, Any, None] | None:
        return self._run("client_disconnected", client)

    def server_connected(self, data: Any) -> Coroutine[Any, Any, None] | None:
        return self._run("server_connected", data)

    def server_disconnected(self, data: Any) -> Coroutine[Any, Any, None] | None:
        return self._run("server_disconnected", data)

    def tls_established_server(self, data: Any) -> Coroutine[Any, Any, None] | None:
        return self._run("tls_established_server", data)

    def http_connect(self, flow: Any) -> Coroutine[Any, Any, None] | None:
        return self._run("http_connect", flow)

    def requestheaders(self, flow: Any) -> Coroutine[Any, Any, None] | None:
        pending = self._run("requestheaders", flow)
        if pending is not None:
            return self._gate_streamed_after(pending, flow)
        return self._gate_streamed(flow)

    async def _gate_streamed_after(self, pending: Awaitable[None], flow: Any) -> None:
        await pending
        gated = self._gate_streamed(flow)
        if gated is not None:
            await gated

    def _gate_streamed(self, flow: Any) -> Coroutine[Any, Any, None] | None:
        if flow.request.stream and flow.response is None and flow.error is None:
            # A body that streams (streaming.py) follows its head to the site as soon as this
            # hook returns, and mitmproxy's `request` hook comes only after the whole body:
            # every gate decides here, before anything leaves (SPEC §4, §5).
            flow.metadata[_GATED_AT_HEADERS] = True
            pending = self._run("request", flow)
            if pending is not None:
                return _discard_if_answered_after(pending, flow)
            _discard_if_answered(flow)
        return None

    def request(self, flow: Any) -> Coroutine[Any, Any, None] | None:
        if flow.metadata.pop(_GATED_AT_HEADERS, False):
            return None  # the gates decided at the request's head
        return self._run("request", flow)

    def responseheaders(self, flow: Any) -> Coroutine[Any, Any, None] | None:
        return self._run("responseheaders", flow)

    def response(self, flow: Any) -> Coroutine[Any, Any, None] | None:
        return self._run("response", flow)

    def error(self, flow: Any) -> Coroutine[Any, Any, None] | None:
        return self._run("error", flow)


async def _finish(name: str, hooks: tuple[Callable[..., Any], ...], i: int, pending: Any,
                  args: tuple[Any, ...]) -> None:
    """The rest of `Chain._run`: `pending` (what hook `i` returned) awaited, then the hooks
    after it, each awaited if it returns an awaitable."""
    if pending is not None:
        try:
            await pending
        except Exception as e:  # noqa: BLE001
            _fault(name, hooks[i], args, e)
    for hook in hooks[i + 1:]:
        try:
            result = hook(*args)
            if result is not None and (type(result) is CoroutineType or isawaitable(result)):
                await result
        except Exception as e:  # noqa: BLE001 - one member's bug never takes the proxy down
            _fault(name, hook, args, e)


def _fault(name: str, hook: Callable[..., Any], args: tuple[Any, ...], e: Exception) -> None:
    where = f"{type(getattr(hook, '__self__', hook)).__name__}.{name}"
    if name in GATE_HOOKS:
        # A member that raised while the request was being judged may have skipped the check
        # that refuses it: the request is answered here, never forwarded (SPEC §12). The
        # members after it still run and skip the answered flow. A member whose work is only
        # a saving (gone memory, the store) catches its own errors and forwards; that choice is
        # made there, explicitly.
        fail_closed(args[0], where, e)
    else:
        FAULTS.report(where, e, "the next member still runs")


def _discard_if_answered(flow: Any) -> None:
    if flow.response is not None or flow.error is not None:
        discard_request_body(flow)  # answered at its head: the body is read and dropped


async def _discard_if_answered_after(pending: Awaitable[None], flow: Any) -> None:
    await pending
    _discard_if_answered(flow)


def build_chain(runtime: Runtime | None = None) -> list[Any]:
    """The etiquette addons as mitmproxy should load them: one Chain over every member."""
    return [Chain(members(runtime or Runtime()))]


def members(rt: Runtime) -> list[Any]:
    """Every etiquette addon, sharing one runtime; order matters (see each hook).

    The links between addons are made here and nowhere else, each with one owner and one
    direction; no addon reads another's attributes:
    - `restraints` (etiquette_proxy/pacing/restraints.py): robots.txt crawl-delay, runaway and
      health each write their own source; pacing reads them all before every decision; the
      dashboard shows them;
    - `pacing.rates` (etiquette_proxy/pacing/rates.py): read-only, the rate each site is paced
      at now, for every audit line (SPEC §10) and the dashboard;
    - callables handed one way: robots.txt fetches take pacing's budget (`before_fetch`),
      canaries ask robots.txt (`robots_allows`), the operator asks pacing what a site asked for
      and tells health to resume or forget;
    - the dashboard is handed each feature's status provider and POST route;
    - `listening` (etiquette_proxy/events.py): Settings emits the address once the proxy
      listens, the operator controls write <state-dir>/proxy-url; every audit record reaches
      the dashboard's board through `Runtime.recorded`.
    """
    restraints = Restraints()
    listening: Broadcast[tuple[str, int]] = Broadcast("listening")
    pacing = Pacing(rt, restraints)
    rates = pacing.rates
    robots = RobotsGate(rt, before_fetch=pacing.robots_turn,  # SPEC §4: robots.txt counts against the budget
                        restraints=restraints, rates=rates)
    health = HealthWatch(rt, robots_allows=robots.allows, restraints=restraints, rates=rates)
    controls = OperatorControls(rt, pacing, health, rates=rates)
    listening.connect(controls.announce)
    target = TargetCheck(rt)
    listening.connect(target.listening)  # SPEC §12: a request to the proxy's own address is a loop
    runaway = RunawayWatch(rt, restraints)
    payments = Payments(rt, before_fetch=pacing.before_robots_fetch)  # SPEC §5: the paid retry takes a turn

    async def robots_sitemaps(origin: str, site: str) -> tuple[str, ...]:
        entry = await robots.service.entry_for(origin, site, None, robots.service.settings_for(site))
        return sitemaps_in_robots(entry.text) if entry.kind == "rules" else ()

    # SPEC §6 `revisit.sitemaps: fetch`: the proxy's own sitemap requests take the site's budget
    # as robots.txt fetches do, find the sitemaps in robots.txt's `Sitemap:` lines, and ask
    # robots.txt like canaries do.
    sitemaps = SitemapHooks(rt, take_turn=pacing.before_robots_fetch, robots_sitemaps=robots_sitemaps,
                            robots_allows=robots.allows)
    revalidation = Revalidation(rt, sitemaps)  # asks the sitemaps' lastmod rules
    dashboard = Dashboard(rt, providers=(pacing.status, robots.status, health.live_fields, controls.status,
                                         runaway.status, payments.status, sitemaps.status),
                          routes={REPORT_PATH: health.post_report, OPERATOR_ROUTE: controls.post},
                          rates=rates, restraints=restraints)
    return [
        Settings(rt, listening),  # options, config, state, audit log; starts each flow's notes
        PaidBodies(),  # SPEC §9: a paid answer's body back in place before any `response` hook reads it
        BodyDigests(),  # SPEC §12: a streamed body's SHA-256 (hashed off the loop) awaited before `response` reads it
        StopGate(rt),  # SPEC §12: while stopping, new requests are answered, never started
        dashboard,  # http://etiquette.proxy/ answered here, before any gate sees it
        AuditLogGate(rt),  # SPEC §11: audit log not writable -> local 503, before anything reaches a site
        target,  # SPEC §4, §12: control bytes, port 0, Host vs authority -> 400; the request head's hygiene
        SiteGrouping(rt),  # SPEC §5 pacing.group_by: the site key every later addon reads
        controls,  # SPEC §3 `sites pause`: before robots, nothing goes out
        robots,  # RFC 9309: refuse before anything else spends the site's budget
        GoneMemory(rt),  # 404/410 remembered: answered locally before any validator work
        sitemaps,  # SPEC §6: sitemaps fetched (request) and read (response); efficiency counted
        revalidation,  # served-stored, validator injection; 304 -> stored 200 in response
        runaway,  # SPEC §7: URL-space traps (requests going upstream), retired sites
        # SPEC §9: stopped sites answered, crawler-max-price offered (request); a 402 paid once and
        # its answer put in place before pacing, health, the trimmer and streaming read it
        payments,
        pacing,  # SPEC §5: hold for the site's turn (request), learn from its answer (responseheaders)
        RefusalTrimmer(rt),  # SPEC §7: page-only headers off refusals (responseheaders)
        health,  # SPEC §8: the request leaves now (its send time)
        RequestSigning(rt),  # SPEC §9: signed last, after every header the proxy adds
        BodyStreams(rt),  # SPEC §12: bodies pass as they arrive, a bounded copy kept (before the timers)
        AuditLogGate(rt),  # SPEC §11 again as the request leaves: the log may have failed while it was held
        ConnectionLimits(rt),  # SPEC §12: timeouts from here (read_timeout), connection limits
        AuditWriter(rt, rates),  # decision header and audit line: last, after every decision is made
    ]
