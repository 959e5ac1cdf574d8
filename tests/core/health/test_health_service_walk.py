"""The health service's ticker visits only the sites whose window is due, and decides, stores
and reports as the walk it replaced: HealthWatch as it was at 23b2c01 (every tick looks up and
ticks every site in memory) is kept here as the reference, and both run the same generated
sequences of responses, ticks, clock moves, extraction reports, canaries, resumes, forgets,
restarts and looks."""

from __future__ import annotations

import asyncio
import json
import math
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from etiquette_proxy.audit.log import audit_record
from etiquette_proxy.clock import FakeClock
from etiquette_proxy.config import load_config
from etiquette_proxy.health.actions import SOURCE
from etiquette_proxy.health.bands import Band, BandChange
from etiquette_proxy.health.canary import FetchFailed
from etiquette_proxy.health.judging import WARMUP_WINDOWS
from etiquette_proxy.health.line import change_record
from etiquette_proxy.health.parser import parse_report
from etiquette_proxy.health.service import HealthService, tick_s
from etiquette_proxy.health.site import NAMESPACE
from etiquette_proxy.state.interface import save
from etiquette_proxy.state.memory import MemoryState
from tests.core.health.service_helpers import (
    ARTICLE,
    CHALLENGE,
    Host,
    Lines,
    StepTime,
    exchange,
    host_of,
)

GOOD = [(200, ARTICLE)] * 6
BAD = [(200, CHALLENGE)] * 3 + [(403, b"Forbidden")] * 3  # scores 40 against a clean baseline


class WalkingHealthService(HealthService):
    """HealthService's ticker and saving as they were at 23b2c01 (the reference): every tick looks
    up and ticks every site in memory, and every site's row is saved once per window (per site,
    the window it was last seen in), origins kept for every site in memory."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._saved_window: dict[str, int] = {}

    def restore(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        self.book.set_limit(int(self.rt.config.get("state.max_sites_in_memory")))
        sites, parsers = {}, {}
        for site, value in self.rt.state.items(NAMESPACE):
            if isinstance(value, dict):
                health = value.get("health")
                if health is not None and (not isinstance(health, dict)
                                           or health.get("band") != Band.HEALTHY.value):
                    sites[site] = health
                if value.get("parser") is not None:
                    parsers[site] = value["parser"]
                    if health is not None:
                        sites[site] = health
        dropped = self.book.load_state({"v": 1, "sites": sites, "parsers": parsers})
        for site in dropped:
            if site != "*":
                self.rt.state.forget(NAMESPACE, site)
        for site in self.book.sites():
            h = self.book.site(site)
            if h.band is not Band.HEALTHY:
                a = h.assessment()
                change = BandChange(site, Band.HEALTHY, h.band, a.score, a.reasons,
                                    "pause" if h.band is Band.HOSTILE else "halve",
                                    h.rate_factor(), False, 0.0)
                self._restrain(site, change)

    def _evicted(self, site: str) -> None:
        self._saved_window.pop(site, None)
        self._origins.pop(site, None)

    def _health(self, site):
        return self.book.site(site)

    def save(self, site: str, h=None) -> None:
        value = {"health": self.book.site(site).to_state(), "parser": None}
        if self.book.knows_parser(site):
            value["parser"] = self.book.parser(site).to_state()
        save(self.rt.state, NAMESPACE, site, value, "health")

    def _maybe_save(self, site, h) -> None:
        index = math.floor(self._clock() / h.settings.window_s)
        if self._saved_window.get(site) != index:
            if site in self._saved_window:
                self.save(site)
            self._saved_window[site] = index

    def _site(self, site, origin=None):
        if not self._loaded:
            self.restore()
        if origin:
            self._origins[site] = origin
        h = self.book.site(site)
        self.ticker.saw(h.settings.window_s)
        return h

    def _after(self, site, h, changes, notes, **_):
        if changes is None:
            pass
        elif isinstance(changes, BandChange):
            self._act(changes, notes)
        else:
            for change in changes:
                if change is not None:
                    self._act(change, notes)
        self._maybe_save(site, h)
        if notes is not None:
            self._annotate(site, notes, h)

    def _act(self, change, notes, h=None) -> None:
        site = change.site
        self._restrain(site, change)
        if notes is not None:
            notes["band_change"] = change_record(change)
        else:
            self._pending.setdefault(site, []).append(change)
        self.save(site)
        if change.alert:
            if notes is not None:
                notes["alert"] = True
            self._alert(change)

    def _alert(self, change) -> None:
        site = change.site
        origin = self._origins.get(site, f"http://{site}")
        self.rt.record(audit_record(
            ts=0.0, outcome="paused", method="-", url=f"{origin}/", site=site,
            status=None, upstream_status=None, waited_s=0.0, rate=self.rates.of(site),
            reason=change.why, client_ua=None, event="health_alert",
            band_change=change_record(change),
            health={"score": change.score, "band": change.to_band.value},
        ))

    def _tick_interval(self) -> float:
        windows = [self.book.site(s).settings.window_s for s in self.book.scored_sites()]
        windows.append(float(self.rt.config.get("health.window")))
        return tick_s(min(windows))

    def tick(self) -> None:
        for site in self.book.scored_sites():
            h = self.book.site(site)
            self._after(site, h, h.tick(), None)

    def forget(self, site: str) -> bool:
        self.restore()
        forgotten = self.book.forget(site)
        self.restraints.release(site, SOURCE)
        self._saved_window.pop(site, None)
        self._pending.pop(site, None)
        self.rt.state.forget(NAMESPACE, site)
        return forgotten

    def report_extraction(self, body: bytes):
        report = parse_report(body)
        site = self.rt.site_keys().of_url(report["url"])
        self.restore()
        self.book.parser(site).record(report["url"], report["ok"], report["reason"])
        self._saved_window.setdefault(site, -1)
        return 202, {"recorded": True, "site": site, **{
            k: v for k, v in self.status(site).items() if k in ("score", "band", "reasons", "parser")}}


RANDOM_SITES = [("a.test", 80, "http"), ("b.test", 443, "https"), ("c.test", 443, "http"),
                ("d.test", 8443, "https"), ("e.test", 80, "http"), ("f.test", 443, "https")]
RANDOM_KEYS = [f"{host}:{port}" for host, port, _ in RANDOM_SITES]
ANSWERS = [(200, ARTICLE), (200, ARTICLE), (200, CHALLENGE), (403, b"Forbidden"), (503, b"busy")]


def one_exchange(watch: HealthService, host: str, port: int, scheme: str, status: int, body: bytes,
                 latency: float) -> dict:
    return exchange(watch, body=body, status=status, latency=latency, host=host, port=port, scheme=scheme)


def unstored(watch: HealthService, state: MemoryState, ticked: bool) -> list[str]:
    """The sites in memory whose last judged window, band, score, probation or warm-up is not
    what their stored row says (nothing stored: nothing closed yet), and, `ticked`, the sites
    whose extraction reports were due by this tick and are not stored."""
    out = []
    for site in watch.book.scored_sites():
        now = watch.book.peek(site).to_state()
        row = state.get(NAMESPACE, site)
        kept = row["health"] if row is not None and row["health"] is not None else None
        if kept is None:
            if now["judged"] is not None or now["band"] != "healthy" or now["warmup"][0]:
                out.append(site)
        elif any(kept[k] != now[k] for k in ("judged", "band", "smoothed", "probation", "warmup")):
            out.append(site)
    if ticked:
        out += [site for site, due in watch._reports.items() if watch._clock() >= due]
    return out


def walk_or_schedule(kind: type[HealthService], seed: int, tmp_path: Path, plan: list, fetch: Any) -> Any:
    """One watch's run of a generated sequence: (step, what the step answered, the audit records it
    wrote, in-memory sites, restraints, changes waiting for a line, the ticker's interval) and, at
    times and at the end, every site's dashboard status; at the end, every row stored."""
    rng = random.Random(seed)
    clock = FakeClock(1_800_000_000.0 + rng.random() * 100)
    config = load_config("", "<test>", ["health.window=10s", "health.min_requests=3",
                                        "health.baseline_days=1", "state.max_sites_in_memory=3",
                                        'sites."e.test:80".health.window=4s'])
    lines, state = Lines(), MemoryState()
    steps = StepTime()

    def start() -> HealthService:
        rt = Host(config=config, state=state)
        rt.audit = lines  # type: ignore[assignment]
        w = kind(rt, clock=clock, fetch=fetch, monotonic=steps.monotonic)
        w.restore()
        return w

    watch = start()
    hostile, busy = 0.0, RANDOM_SITES[:2]
    for step in range(1500):
        if step % 250 == 0:  # a phase: two sites get most of the traffic, this share refused
            hostile = rng.choice([0.0, 0.5, 1.0, 1.0])
            busy = rng.sample(RANDOM_SITES, 2)
        host, port, scheme = busy[0] if rng.random() < 0.7 else rng.choice(RANDOM_SITES)
        key = f"{host}:{port}"
        op = rng.random()
        written = len(lines.records)
        got: Any = None
        if op < 0.55:
            status, body = rng.choice(ANSWERS[2:] if rng.random() < hostile else ANSWERS[:2])
            got = one_exchange(watch, host, port, scheme, status, body, rng.choice([0.01, 0.05, 0.3]))
        elif op < 0.62:
            watch.tick()
        elif op < 0.8:
            r = rng.random()
            if r < 0.02:
                clock.advance(-rng.uniform(1, 15))  # the wall clock stepped back
            elif r < 0.08:
                clock.advance(rng.choice([25.0, 3600.0, 86400.0]) * rng.uniform(0.5, 1.1))
            else:
                clock.advance(rng.uniform(0.5, 2.5))
        elif op < 0.85:
            ok = rng.random() < 0.6
            got = watch.report_extraction(json.dumps(
                {"url": f"{scheme}://{host}:{port}/p", "ok": ok, "reason": "" if ok else "no title"}).encode())
        elif op < 0.9:
            plan[:] = [rng.choice([(200, True), (200, True), (200, True), (200, False), (503, False), None])]
            asyncio.run(watch.canary(key, f"{scheme}://{host}:{port}/c", "words"))
        elif op < 0.93:
            got = watch.resume(key)
        elif op < 0.94:
            got = watch.forget(key)
        elif op < 0.96:
            watch.stop()
            watch = start()
        else:
            got = [watch.status(key), watch.live_fields(key)]
        if kind is HealthService:
            assert not unstored(watch, state, 0.55 <= op < 0.62), step
        new_lines = sorted(json.dumps(x, sort_keys=True) for x in lines.records[written:])  # one tick: any order
        restraints = [repr(watch.restraints.get(s, "health")) for s in RANDOM_KEYS]
        yield [step, got, new_lines, [watch.book.knows(s) for s in RANDOM_KEYS], restraints,
               {s: [change_record(c) for c in v] for s, v in watch._pending.items()}, watch._tick_interval()]
        if step % 25 == 0:
            yield [step, [watch.status(s) for s in RANDOM_KEYS]]
    watch.stop()
    yield ["end", [watch.status(s) for s in RANDOM_KEYS], sorted(state.items(NAMESPACE))]


@pytest.mark.parametrize("seed", range(6))
def test_the_ticker_decides_stores_and_reports_as_the_walk_did(seed, tmp_path):
    plan: list = []

    async def fake_fetch(url, headers, timeout_s, max_bytes):
        answer = plan[0]
        if answer is None:
            raise FetchFailed("connection refused")
        status, found = answer
        body = ARTICLE if found else b"<html>a different page</html>"
        return SimpleNamespace(status=status, body=body, headers=[("Content-Type", "text/html")])

    walked = walk_or_schedule(WalkingHealthService, seed, tmp_path, plan, fake_fetch)
    scheduled = walk_or_schedule(HealthService, seed, tmp_path, plan, fake_fetch)
    for a, b in zip(walked, scheduled, strict=True):
        assert a == b, f"seed {seed}, step {a[0]}"


def feed(watch: HealthService, answers: list[tuple[int, bytes]], host: str, **kw: Any) -> None:
    for status, body in answers:
        exchange(watch, body=body, status=status, host=host, **kw)


def test_the_ticker_leaves_the_order_of_use_as_it_was(tmp_path, clock):
    """A band change closed by the ticker stores the site without making it the most recently
    used: which site leaves memory next is the same as with the walk, which looked every site
    up in order (keeping their order)."""
    evicted = {}
    for kind in (WalkingHealthService, HealthService):
        watch = kind(host_of(tmp_path, "state.max_sites_in_memory=3"), clock=clock)
        clock.now = 1_800_000_000.0
        for _ in range(WARMUP_WINDOWS + 1):
            feed(watch, GOOD, "b.test")
            clock.advance(10)
        feed(watch, BAD, "b.test")
        clock.advance(10)
        feed(watch, GOOD, "b.test")  # its first count closes the bad window: degrading
        assert watch.book.site("b.test:80").band is Band.DEGRADING
        exchange(watch, host="a.test")
        exchange(watch, host="c.test")  # used last: c, then a, then b
        clock.advance(10)
        evictions: list[str] = []
        watch.book._on_evict = evictions.append
        watch.tick()  # closes b's good window: healthy again
        assert watch.book.peek("b.test:80").band is Band.HEALTHY  # (a look that reorders nothing)
        assert watch.restraints.get("b.test:80", "health") is None
        exchange(watch, host="d.test")
        evicted[kind] = evictions
    assert evicted[HealthService] == evicted[WalkingHealthService] == ["b.test:80"]


def test_a_restored_site_alerts_under_the_origin_it_always_did(tmp_path, clock):
    """A site read back at start with counts in its open window, whose close at the first tick
    makes it hostile: no count named its origin, so its alert line says http://, as before."""
    lines = {}
    for kind in (WalkingHealthService, HealthService):
        rt = host_of(tmp_path)
        watch = kind(rt, clock=clock)
        clock.now = 1_800_000_000.0
        https = {"port": 443, "scheme": "https"}
        for _ in range(WARMUP_WINDOWS + 1):
            feed(watch, GOOD, "b.test", **https)
            clock.advance(10)
        for _ in range(3):  # scores 76, 62, 53 as the next window's first count closes each
            feed(watch, BAD, "b.test", **https)
            clock.advance(10)
        feed(watch, BAD, "b.test", **https)
        assert watch.book.site("b.test:443").band is Band.DEGRADING
        watch.stop()  # stored with the fourth bad window open
        again = Host(config=rt.config, state=rt.state)
        again.audit = Lines()  # type: ignore[assignment]
        restored = kind(again, clock=clock)
        restored.restore()
        clock.advance(10)
        restored.tick()  # closes it: 48, hostile
        lines[kind] = again.audit.records  # type: ignore[attr-defined]
    [alert] = [r for r in lines[HealthService] if r.get("event") == "health_alert"]
    assert alert["url"] == "http://b.test:443/"
    assert lines[HealthService] == lines[WalkingHealthService]

