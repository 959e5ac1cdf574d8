"""addons/master.py: `run`'s mitmproxy master dispatches hooks as mitmproxy's own AddonManager
does (order, awaiting, AddonHalt, one addon's error not stopping the next), from a table that
follows every change of the addon tree (issue 17)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from addons.master import HookTable, ProductMaster, product_addons
from mitmproxy import addonmanager, exceptions, options
from mitmproxy.master import Master
from mitmproxy.proxy.layers import http
from mitmproxy.test import tflow


class Recorder:
    def __init__(self, name: str, calls: list[str], *, fail: Exception | None = None, sleep: bool = False):
        self.name, self.calls, self.fail, self.sleep = name, calls, fail, sleep

    async def request(self, flow) -> None:
        if self.sleep:
            await asyncio.sleep(0)  # a real suspension: the next addon must wait for it
        self.calls.append(f"{self.name}:{flow.id[:4]}")
        if self.fail is not None:
            raise self.fail


class Parent:
    """An addon with children, as mitmproxy's `addons` attribute defines them."""

    def __init__(self, calls: list[str]):
        self.name = "parent"
        self.calls = calls
        self.addons = [Recorder("child-1", calls, fail=RuntimeError("child broke")), Recorder("child-2", calls)]

    def request(self, flow) -> None:
        self.calls.append("parent")


async def dispatch(kind: str, build) -> list[str]:
    """The same addons under mitmproxy's AddonManager or under HookTable: the calls they got."""
    master = Master(options.Options())
    if kind == "table":
        master.addons = HookTable(master)
    calls: list[str] = []
    build(master, calls)
    flow = tflow.tflow()
    try:
        await master.addons.handle_lifecycle(http.HttpRequestHook(flow))
        await master.addons.trigger_event(http.HttpRequestHook(flow))
        if kind == "table":  # fire_now (addons/inline_hooks.py): the same calls, the rest awaited
            hook = http.HttpRequestHook(flow)
            pending = master.addons.fire_now(hook, hook.args())
            if pending is not None:
                await pending
        else:
            await master.addons.handle_lifecycle(http.HttpRequestHook(flow))
    finally:
        master._legacy_log_events.uninstall()  # its handler posts to this loop: gone after the test
    return [c.split(":")[0] for c in calls]


@pytest.mark.parametrize("build", [
    lambda m, calls: m.addons.add(Recorder("a", calls, sleep=True), Recorder("b", calls)),
    lambda m, calls: m.addons.add(Recorder("a", calls, fail=RuntimeError("boom")), Recorder("b", calls)),
    lambda m, calls: m.addons.add(Recorder("a", calls, fail=exceptions.AddonHalt()), Recorder("b", calls)),
    lambda m, calls: m.addons.add(Parent(calls), Recorder("after", calls)),
], ids=["order-and-await", "error-next-runs", "halt-stops", "children-as-a-group"])
def test_hook_table_calls_what_mitmproxys_manager_calls(build, caplog) -> None:
    with caplog.at_level(logging.ERROR, logger=addonmanager.__name__):
        theirs = asyncio.run(dispatch("mitmproxy", build))
        mitm_errors = [r.getMessage() for r in caplog.records]
        caplog.clear()
        ours = asyncio.run(dispatch("table", build))
        our_errors = [r.getMessage() for r in caplog.records]
    assert ours == theirs
    assert our_errors == mitm_errors  # an addon's error is logged the same way, once per event


def test_options_error_still_reaches_the_caller() -> None:
    async def go() -> None:
        master = Master(options.Options())
        master.addons = HookTable(master)
        master.addons.add(Recorder("a", [], fail=exceptions.OptionsError("bad option")))
        await master.addons.trigger_event(http.HttpRequestHook(tflow.tflow()))
    with pytest.raises(exceptions.OptionsError):
        asyncio.run(go())


def test_the_table_follows_adds_and_removes() -> None:
    async def go() -> list[str]:
        master = Master(options.Options())
        master.addons = HookTable(master)
        calls: list[str] = []
        first = Recorder("first", calls)
        master.addons.add(first)
        await master.addons.trigger_event(http.HttpRequestHook(tflow.tflow()))  # table built
        master.addons.add(Recorder("second", calls))
        await master.addons.trigger_event(http.HttpRequestHook(tflow.tflow()))
        master.addons.remove(first)
        await master.addons.trigger_event(http.HttpRequestHook(tflow.tflow()))
        return [c.split(":")[0] for c in calls]
    assert asyncio.run(go()) == ["first", "first", "second", "second"]


def test_product_master_keeps_what_run_relies_on() -> None:
    async def go() -> tuple[set[str], list[str]]:
        master = ProductMaster(options.Options())
        names = {type(a).__name__ for a in master.addons.chain}
        # The options `Settings` sets (addons/settings.py) exist, registered by the kept addons.
        master.options.update(connection_strategy="lazy", ssl_insecure=True, proxyauth="u:p-long-enough",
                              mode=["regular"])
        return names, [type(a).__name__ for a in product_addons()]
    names, listed = asyncio.run(go())
    assert names == set(listed)
    assert {"Proxyserver", "NextLayer", "TlsConfig", "ProxyAuth", "Block", "ErrorCheck"} <= names
    # Left out: the addons that rewrite or replay flows, and mitm.it's page.
    assert not names & {"MapLocal", "MapRemote", "ModifyBody", "ModifyHeaders", "ServerPlayback", "Onboarding"}


def test_run_skips_mitmproxys_debug_typechecks_only_where_it_is_called() -> None:
    # Process-wide, so in a process of its own: the checks stay on for every other test here.
    import subprocess
    import sys
    probe = (
        "from mitmproxy import http\n"
        "from addons.master import skip_message_typechecks\n"
        "def build():\n"
        "    http.Response(http_version=b'HTTP/1.1', status_code=200, reason=b'OK', headers=http.Headers(),\n"
        "                  content=b'', trailers=None, timestamp_start='not a float', timestamp_end=None)\n"
        "try:\n    build()\nexcept TypeError:\n    print('checked')\n"
        "skip_message_typechecks()\nbuild()\nprint('skipped')\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["checked", "skipped"], out.stderr


def test_proxyauth_hooks_only_while_its_option_is_set() -> None:
    """ProxyAuth does nothing without `proxyauth`: out of the table then, back (and enforcing)
    once the option is set, as `listen.proxyauth` sets it (SPEC §12)."""
    async def go() -> tuple[bool, bool, int | None, bool]:
        master = ProductMaster(options.Options())
        try:
            def in_table() -> bool:
                return any(getattr(f, "__self__", None).__class__.__name__ == "ProxyAuth"
                           for group in master.addons._hooks(http.HttpRequestHeadersHook(tflow.tflow()))
                           for f in group)
            before = in_table()
            master.options.update(proxyauth="user:secret-pass")
            after = in_table()
            f = tflow.tflow()
            await master.addons.handle_lifecycle(http.HttpRequestHeadersHook(f))
            status = f.response.status_code if f.response else None
            master.options.update(proxyauth=None)
            return before, after, status, in_table()
        finally:
            master._legacy_log_events.uninstall()
    before, after, status, unset_again = asyncio.run(go())
    assert (before, after, unset_again) == (False, True, False)
    assert status == 407  # ProxyAuth's configure ran on the change: it asks for credentials


def test_fire_now_leaves_nothing_to_await_when_every_hook_returned_at_once() -> None:
    class Sync:
        def __init__(self, calls: list[str], name: str) -> None:
            self.calls, self.name = calls, name

        def request(self, flow) -> None:
            self.calls.append("sync")

    async def go() -> tuple[bool, bool, list[str]]:
        master = Master(options.Options())
        master.addons = HookTable(master)
        calls: list[str] = []
        try:
            master.addons.add(Sync(calls, "s1"), Sync(calls, "s2"))
            hook = http.HttpRequestHook(tflow.tflow())
            at_once = master.addons.fire_now(hook, hook.args()) is None
            master.addons.add(Recorder("waits", calls, sleep=True), Sync(calls, "s3"))
            pending = master.addons.fire_now(hook, hook.args())
            before_wait = list(calls)
            assert pending is not None
            await pending
            return at_once, before_wait == ["sync"] * 4, calls
        finally:
            master._legacy_log_events.uninstall()
    at_once, stopped_at_the_wait, calls = asyncio.run(go())
    assert at_once and stopped_at_the_wait  # the hook after the waiting one had not run yet
    assert calls == ["sync"] * 4 + ["waits:" + calls[4].split(":")[1], "sync"]
