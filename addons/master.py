"""The mitmproxy master `etiquette-proxy run` builds: only the mitmproxy addons the product uses,
and hook dispatch from a table.

Why (figures in benchmarks/README.md, "lean master"): `DumpMaster` loads 34 addons
(map_local, stickycookie, save, serverplayback, ...) and mitmproxy's `AddonManager` walks every
one of them, with a `getattr` and a context manager each, for every event of every flow: that
dispatch alone costs more CPU per flow than the whole etiquette chain. None of those addons does anything here (their options are never set), so a forward
proxy that keeps only the ones below serves the same bytes for less.

Kept, and why each:
- `Core`: option checks and the core commands.
- `Block`: refuses clients from outside the host when listening beyond loopback (SPEC §12,
  mitmproxy's `block_global`/`block_private`).
- `ProxyAuth`: `listen.proxyauth` (SPEC §12) sets mitmproxy's `proxyauth` option.
  Its hooks are dispatched only while that option is set (it does nothing otherwise).
- `Proxyserver`, `NextLayer`, `TlsConfig`: the proxy itself, its layers, HTTPS interception and
  upstream certificate checks (`upstream.insecure`, `upstream.ca_file`).
- `DisableH2C`: a request to upgrade to h2c, which mitmproxy cannot intercept, is refused.
- `ErrorCheck`: start-up errors give a non-zero exit code.
Left out, with what that changes for a user: `mitm.it` (the Onboarding page) is not served by
the proxy (the CA is exported with `etiquette-proxy ca`); mitmproxy options of the left-out
addons (`--set map_local=...` and the like) do not exist in `run` (its `--set` is etiquette's
own). `mitmdump -s addons/etiquette.py` still runs the chain inside a full mitmdump.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from mitmproxy import addonmanager, exceptions, flow, hooks, http, master, options
from mitmproxy.addons import block, core, disable_h2c, errorcheck, next_layer, proxyauth, proxyserver, tlsconfig

from addons import inline_hooks

_UPDATE = hooks.UpdateHook([])  # only its name is read: the table's key


def product_addons() -> list[Any]:
    """The mitmproxy addons `run` needs, in mitmproxy's own default order."""
    return [core.Core(), block.Block(), disable_h2c.DisableH2C(), proxyauth.ProxyAuth(),
            proxyserver.Proxyserver(), next_layer.NextLayer(), tlsconfig.TlsConfig(),
            errorcheck.ErrorCheck()]


def skip_message_typechecks() -> None:
    """Skip mitmproxy's field type checks on every Request/Response built (`run` only).

    `MessageData.__post_init__` checks each field's type against its annotation, under `if
    __debug__` (gone under `python -O`), twice per request, at a cost comparable to the whole
    etiquette chain's. The checks catch programming errors, not
    bad input (what arrives from a client or a site is parsed into bytes by mitmproxy before a
    message is built), so `run` skips them while the unit and addon tests, which build their
    flows without this, keep them.
    """
    http.MessageData.__post_init__ = _no_check  # type: ignore[method-assign]


def _no_check(self: Any) -> None:
    return None


class HookTable(addonmanager.AddonManager):
    """mitmproxy's AddonManager with each event's hooks looked up once, not per event.

    `AddonManager.trigger_event` walks the addon tree with `getattr` for every event and wraps
    each addon in `safecall()`; here the callables per event name are kept in a table, emptied
    whenever the tree changes (add, register, remove, clear). What a hook sees is the same:
    the hooks run in chain order, an async result is awaited, `AddonHalt` stops the event, and
    an addon's exception is handled by mitmproxy's own `safecall` (logged, next addon runs;
    `OptionsError` propagates) -- `safecall` is entered only on that rare path.
    """

    def __init__(self, master: Any):
        super().__init__(master)
        self._table: dict[str, tuple[tuple[Callable[..., Any], ...], ...]] = {}

    def register(self, addon: Any) -> Any:
        self._table.clear()
        return super().register(addon)

    def add(self, *addons: Any) -> None:
        super().add(*addons)
        self._table.clear()

    def remove(self, addon: Any) -> None:
        super().remove(addon)
        self._table.clear()

    def clear(self) -> None:
        super().clear()
        self._table.clear()

    def _configure_all(self, updated: set[str]) -> None:
        if "proxyauth" in updated:
            self._table.clear()  # before the configure event, so ProxyAuth's configure runs
        super()._configure_all(updated)

    def _hooks(self, event: hooks.Hook) -> tuple[tuple[Callable[..., Any], ...], ...]:
        found = self._table.get(event.name)
        if found is None:
            # One group per top-level addon, as mitmproxy's safecall wraps each addon's subtree.
            # mitmproxy's ProxyAuth does nothing while its `proxyauth` option is unset (the
            # default: `listen.proxyauth` not configured), so its hooks stay out of the table
            # then; `_configure_all` rebuilds the table when that option changes.
            idle = () if getattr(self.master.options, "proxyauth", None) else (proxyauth.ProxyAuth,)
            groups = (tuple(func for _, func in self._iter_hooks(top, event))
                      for top in self.chain if not isinstance(top, idle))
            found = self._table[event.name] = tuple(g for g in groups if g)
        return found

    def trigger_event(self, event: hooks.Hook) -> Coroutine[Any, Any, None]:
        # A plain function returning `_fire`'s coroutine: callers await it (or make a task of
        # it) as before, and one coroutine, not two nested ones, runs per event.
        return self._fire(self._hooks(event), event.args())

    def handle_lifecycle(self, event: hooks.Hook) -> Coroutine[Any, Any, None]:
        # As AddonManager.handle_lifecycle: the event, then `update` for a flow. No addon here
        # has an `update` hook, so then the event's own coroutine is all that runs (the table
        # lookup is made when the event is fired; the table changes only when addons do).
        args = event.args()
        if isinstance(args[0], flow.Flow) and self._hooks(_UPDATE):
            return self._fire_with_update(event, args)
        return self._fire(self._hooks(event), args)

    async def _fire_with_update(self, event: hooks.Hook, args: list[Any]) -> None:
        await self._fire(self._hooks(event), args)
        await self._fire(self._hooks(_UPDATE), [[args[0]]])

    def fire_now(self, event: hooks.Hook, args: list[Any]) -> Coroutine[Any, Any, None] | None:
        """`handle_lifecycle(event)` run now: None when every hook returned at once, else an
        awaitable of the rest, from the hook that returned one (addons/inline_hooks.py)."""
        if isinstance(args[0], flow.Flow) and self._hooks(_UPDATE):
            return self._fire_with_update(event, args)
        return self._start(self._hooks(event), args, 0, 0)

    async def _fire(self, groups: Sequence[tuple[Callable[..., Any], ...]], args: list[Any]) -> None:
        rest = self._start(groups, args, 0, 0)
        if rest is not None:
            await rest

    def _start(self, groups: Sequence[tuple[Callable[..., Any], ...]], args: list[Any], g: int,
               i: int) -> Coroutine[Any, Any, None] | None:
        """The hooks from hook `i` of group `g` on, in order, until one returns an awaitable:
        None when none did, else the coroutine that awaits it and runs the rest (`_after`).
        An exception ends its group (mitmproxy's safecall logs it), AddonHalt the event."""
        one = len(args) == 1
        arg = args[0] if one else None
        for g in range(g, len(groups)):
            group = groups[g]
            try:
                for i in range(i, len(group)):
                    # func(arg): a plain call, cheaper than func(*args) (CPython 3.11 inlines it)
                    res = group[i](arg) if one else group[i](*args)
                    if res is not None and inspect.isawaitable(res):
                        return self._after(groups, args, g, i, res)
            except exceptions.AddonHalt:
                return None
            except Exception as e:  # noqa: BLE001 -- handed to mitmproxy's own handler below
                with addonmanager.safecall():
                    raise e
            i = 0
        return None

    async def _after(self, groups: Sequence[tuple[Callable[..., Any], ...]], args: list[Any], g: int, i: int,
                     pending: Awaitable[Any]) -> None:
        """`pending` (what hook `i` of group `g` returned) awaited, then the hooks after it."""
        try:
            await pending
        except exceptions.AddonHalt:
            return
        except Exception as e:  # noqa: BLE001
            with addonmanager.safecall():
                raise e
            g, i = g + 1, -1  # the rest of its group is skipped, as for a hook that raised
        rest = self._start(groups, args, g, i + 1)
        if rest is not None:
            await rest


class ProductMaster(master.Master):
    """A mitmproxy master with `product_addons()` and the hook table (no termlog, no dumper:
    the product's own logging and audit log say what happens)."""

    def __init__(self, opts: options.Options):
        super().__init__(opts, with_termlog=False)
        self.addons = HookTable(self)
        self.addons.add(*product_addons())
        inline_hooks.install()
