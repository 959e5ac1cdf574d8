"""addons/inline_hooks.py: under `run`'s master a flow's hooks that finish at once run where
mitmproxy starts them, with no task per hook; a hook that must wait, or an intercepted flow,
continues in a task exactly as before (issue 36).

Each test runs the real mitmproxy proxy server of a ProductMaster on a loopback port in front
of a small local site, and a raw HTTP/1.1 client; what the site received is checked as well as
what the client got."""

from __future__ import annotations

import asyncio
from typing import Any

from addons.master import ProductMaster
from mitmproxy import options


class Site:
    """A local HTTP/1.1 site answering every request 200 with its path; it logs the paths."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.server: asyncio.base_events.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1].decode()
                self.paths.append(path)
                body = path.encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


async def fetch(proxy_port: int, site_port: int, paths: list[str]) -> list[bytes]:
    """GET each path through the proxy over one keep-alive connection: the bodies."""
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
    bodies = []
    try:
        for path in paths:
            writer.write(f"GET http://127.0.0.1:{site_port}{path} HTTP/1.1\r\nHost: 127.0.0.1:{site_port}\r\n\r\n"
                         .encode())
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            bodies.append(await reader.readexactly(length))
    finally:
        writer.close()
    return bodies


async def through_proxy(addons: list[Any], paths: list[str]) -> tuple[list[bytes], list[str], list[str]]:
    """The bodies the client got, the paths the site saw, and the names of the coroutines run
    as tasks while the requests went through a ProductMaster with `addons`."""
    loop = asyncio.get_running_loop()
    tasks: list[str] = []

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        tasks.append(getattr(coro, "__qualname__", type(coro).__name__))
        return asyncio.Task(coro, loop=loop, **kwargs)

    site = Site()
    site_port = await site.start()
    master = ProductMaster(options.Options())
    master.options.update(listen_host="127.0.0.1", listen_port=0, mode=["regular"], connection_strategy="lazy")
    master.addons.add(*addons)
    running = asyncio.ensure_future(master.run())
    try:
        for _ in range(200):
            addrs = master.addons.get("proxyserver").listen_addrs()
            if addrs:
                break
            await asyncio.sleep(0.01)
        loop.set_task_factory(factory)
        bodies = await fetch(addrs[0][1], site_port, paths)
        loop.set_task_factory(None)
    finally:
        loop.set_task_factory(None)
        master.shutdown()
        await asyncio.wait_for(running, 10)
        assert site.server is not None
        site.server.close()
    return bodies, site.paths, tasks


class Counting:
    """Synchronous hooks on every step of a flow."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def requestheaders(self, flow: Any) -> None:
        self.seen.append("requestheaders")

    def request(self, flow: Any) -> None:
        self.seen.append("request")

    def responseheaders(self, flow: Any) -> None:
        self.seen.append("responseheaders")

    def response(self, flow: Any) -> None:
        self.seen.append("response")


def test_hooks_that_finish_at_once_run_without_a_task_each() -> None:
    counting = Counting()
    bodies, site_saw, tasks = asyncio.run(through_proxy([counting], ["/a", "/b", "/c"]))
    assert bodies == [b"/a", b"/b", b"/c"] and site_saw == ["/a", "/b", "/c"]
    assert counting.seen == ["requestheaders", "request", "responseheaders", "response"] * 3
    # mitmproxy's own path makes one `hook_task` per hook: 12 here, and none on this one.
    assert not [t for t in tasks if "hook_task" in t or "_rest" in t], tasks


class Background:
    """A request hook that starts a task of its own (as a robots.txt or sitemap refresh does)."""

    def __init__(self, order: list[str]) -> None:
        self.order = order

    def request(self, flow: Any) -> None:
        async def refresh() -> None:
            self.order.append("background task")
        asyncio.ensure_future(refresh())


class Waits:
    """A request hook that queues, then waits (as pacing does for a turn)."""

    def __init__(self, order: list[str]) -> None:
        self.order = order

    async def request(self, flow: Any) -> None:
        self.order.append("queued")
        await asyncio.sleep(0.05)
        self.order.append("waited")


class After:
    def __init__(self, order: list[str]) -> None:
        self.order = order

    def request(self, flow: Any) -> None:
        self.order.append(f"after {flow.request.path}")


def test_a_hook_that_waits_queues_at_once_and_the_rest_run_after_it() -> None:
    order: list[str] = []
    bodies, site_saw, tasks = asyncio.run(through_proxy([Background(order), Waits(order), After(order)], ["/x"]))
    assert bodies == [b"/x"] and site_saw == ["/x"]
    # The waiting hook ran up to its wait before the task the hook before it started, as it
    # did when the whole hook ran in one task; the hook after it only once it had waited.
    assert order == ["queued", "background task", "waited", "after /x"]
    assert [t for t in tasks if "_rest" in t], tasks  # the request hook went on in a task


class Intercepts:
    """Holds every request (mitmproxy's intercept) and resumes it 50 ms later."""

    def __init__(self) -> None:
        self.resumed = 0

    def request(self, flow: Any) -> None:
        flow.intercept()

        def resume() -> None:
            self.resumed += 1
            flow.resume()
        asyncio.get_running_loop().call_later(0.05, resume)


def test_an_intercepted_flow_waits_for_its_resume() -> None:
    intercepts = Intercepts()
    bodies, site_saw, _ = asyncio.run(through_proxy([intercepts], ["/held"]))
    assert bodies == [b"/held"] and site_saw == ["/held"] and intercepts.resumed == 1
