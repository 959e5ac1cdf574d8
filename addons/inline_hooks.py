"""Hooks that finish at once run where mitmproxy starts them, without a task each (issue 36).

mitmproxy 11 runs every hook of every flow (requestheaders, request, responseheaders,
response, error) in an asyncio task of its own: `ConnectionHandler.server_event` meets the
layer's `StartHook` command and calls `asyncio_utils.create_task(self.hook_task(hook))`; the
task runs `handle_hook` (the addons, a watchdog context, `wait_for_resume`) on a later turn of
the loop and then hands the layer `HookCompleted` through `server_event` again. That machinery
(a named task with its debug info and done callback, four coroutines, two loop turns) costs
more per request than most of the chain's members, and the chain's hooks now return at once
on the common paths (addons/chain.py).

Under `run`'s master (whose `HookTable` can say whether a hook finished: `fire_now`) a hook is
run on the spot instead, as mitmproxy itself runs it on Python 3.12+, where its eager task
factory starts `hook_task` inside `server_event` (mitmproxy issue 7027, the reason for
`_server_event_lock`); when it finished (no addon returned an awaitable, the flow is not
intercepted) its `HookCompleted` is handed to the layer right after the event that started it,
as the eager task would once the lock is free. Anything else (an addon that waits: a
robots.txt fetch, a pacing line; an intercepted flow; an `update` hook) continues in a task as
before, from the addon that returned the awaitable, so nothing runs twice and the order of the
addons is the same. That addon's awaitable is run up to its first wait on the spot, as an eager
task runs it: what it queues for (a pacing turn) is queued before any task an earlier addon
started for the same flow (a robots.txt or sitemap refresh), as when the whole hook ran in one
task (tests/e2e/test_sitemaps.py saw the difference: the proxy's own sitemap fetch took the
turn of the request that started it). Other masters (`mitmdump -s addons/etiquette.py`, the
tests' DumpMaster) keep mitmproxy's path untouched.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Awaitable, Coroutine, Generator
from typing import Any

import addons.mitm_version  # noqa: F401 - first: an unverified mitmproxy stops here, before the patch
from mitmproxy import flow
from mitmproxy.proxy import commands, events, mode_servers
from mitmproxy.proxy import server as proxy_server

_DONE_ATTR = "_etiquette_hooks_done"  # per handler: hooks finished on the spot, in order
_ARGS: dict[type, tuple[str, ...]] = {}  # hook class -> its fields' names, in order (Hook.args)


class _Finished:
    """What `hook_task` returns for a hook that finished on the spot; the copy of mitmproxy's
    `asyncio_utils` in proxy/server.py hands it back as its own finished "task"."""

    __slots__ = ()

    def add_done_callback(self, callback: Any) -> None:
        callback(self)  # `hook_tasks.remove`: it is done already


_FINISHED = _Finished()
_installed = False


def install() -> None:
    """Patch mitmproxy's ProxyConnectionHandler (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    handler = mode_servers.ProxyConnectionHandler
    hook_task = proxy_server.ConnectionHandler.hook_task
    server_event = proxy_server.ConnectionHandler.server_event

    def hook_task_inline(self: Any, hook: commands.StartHook) -> Any:
        fire_now = getattr(self.master.addons, "fire_now", None)
        if fire_now is None:
            return hook_task(self, hook)
        names = _ARGS.get(hook.__class__)
        if names is None:  # hook.args() reads its dataclass fields on every call
            names = _ARGS[hook.__class__] = tuple(f.name for f in dataclasses.fields(hook))
        args = [getattr(hook, name) for name in names]
        pending = fire_now(hook, args)
        if pending is not None:
            # As an eager task starts: the addon that must wait runs up to its first wait now,
            # so what it queues for (a pacing turn) is queued before any task an addon before
            # it started (a robots.txt or sitemap refresh), as when the whole hook ran in one task.
            try:
                pending = _Started(pending, pending.send(None))
            except StopIteration:
                pending = None
        data = args[0]
        if pending is None and not (isinstance(data, flow.Flow) and data.intercepted):
            if hook.blocking:
                done = self.__dict__.get(_DONE_ATTR)
                if done is None:
                    done = self.__dict__[_DONE_ATTR] = deque()
                done.append(hook)
            return _FINISHED
        return _rest(self, hook, data, pending)

    async def server_event_inline(self: Any, event: events.Event) -> None:
        await server_event(self, event)
        done = self.__dict__.get(_DONE_ATTR)
        while done:
            await server_event(self, events.HookCompleted(done.popleft()))

    handler.hook_task = hook_task_inline  # type: ignore[method-assign]
    handler.server_event = server_event_inline  # type: ignore[method-assign]
    # proxy/server.py's own name for mitmproxy's asyncio_utils: a copy whose create_task passes
    # _FINISHED through (every other coroutine goes to mitmproxy's create_task).
    utils = proxy_server.asyncio_utils
    proxy_server.asyncio_utils = _AsyncioUtils(utils)  # type: ignore[assignment]


class _AsyncioUtils:
    """mitmproxy.utils.asyncio_utils as proxy/server.py sees it: `create_task` of _FINISHED is
    _FINISHED; everything else is the module's own."""

    def __init__(self, module: Any):
        self._module = module
        self._create_task = module.create_task

    def create_task(self, coro: Any, *args: Any, **kwargs: Any) -> Any:
        if coro is _FINISHED:
            return _FINISHED
        return self._create_task(coro, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


class _Started:
    """A coroutine already run up to its first wait (`first`, what it yielded to the task),
    awaited from there on: each value it yields goes to the awaiting task, and what the task
    sends or throws (a cancellation) goes back into it, as `await` does for a fresh one."""

    __slots__ = ("_coro", "_first")

    def __init__(self, coro: Coroutine[Any, Any, Any], first: Any):
        self._coro, self._first = coro, first

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, waiting = self._coro, self._first
        while True:
            try:
                sent = yield waiting
            except BaseException as e:  # noqa: BLE001 - thrown in by the task: the coroutine's to handle
                try:
                    waiting = coro.throw(e)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    waiting = coro.send(sent)
                except StopIteration as stop:
                    return stop.value


async def _rest(handler: Any, hook: commands.StartHook, data: Any, pending: Awaitable[None] | None) -> None:
    """mitmproxy's hook_task from where the addons had to wait: the rest of them, the flow's
    resume (an intercepted flow), then HookCompleted."""
    with handler.timeout_watchdog.disarm():
        if pending is not None:
            await pending
        if isinstance(data, flow.Flow):
            await data.wait_for_resume()
    if hook.blocking:
        await handler.server_event(events.HookCompleted(hook))
