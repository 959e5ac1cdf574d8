"""File descriptors and the connections that hold them (SPEC §12): the limit, the log of running
out, and the book of which connection goes first when one must.

The addon (addons/connections.py) keeps the deadlines and closes connections through mitmproxy;
this module decides, from ids and times alone:
- the soft RLIMIT_NOFILE is raised to the hard one at start;
- "Too many open files" is logged at most once a second, with a count of what was left out;
- client connections are kept within the limit less a reserve (a quarter, at least 64) for site
  connections: past it, a new connection closes the oldest one that has not sent a complete
  request head yet, so a slowloris cannot take the descriptors a normal client's site
  connection needs;
- site connections are closed least recently used first (idle, or over
  `upstream.max_connections`).
"""

from __future__ import annotations

import errno
import logging
import resource
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from etiquette_proxy.clock import Clock, monotonic

log = logging.getLogger(__name__)

C = TypeVar("C")
CAP_WARNING_EVERY_S = 60.0  # "all site connections in use" at most once a minute


def raise_fd_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit; the (soft, hard) now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as e:
            log.warning("could not raise the open-file limit from %s to %s: %s", soft, hard, e)
    return soft, hard


def fd_limit() -> int:
    """The soft RLIMIT_NOFILE in force."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class DescriptorExhaustion(logging.Filter):
    """Lets one "Too many open files" record through per second; counts the rest (SPEC §12).

    Out of descriptors, every accept and every connect fails at once, and each failure would
    log a traceback: tens of thousands a second. One line a second says the same thing.
    """

    def __init__(self, every_s: float = 1.0, clock: Clock = monotonic):
        super().__init__()
        self.every_s = every_s
        self.clock = clock
        self._last = -float("inf")
        self.suppressed = 0

    @staticmethod
    def is_exhaustion(record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
            return True
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a record that cannot format is not ours to judge
            return False
        return "Too many open files" in message or "out of system resource" in message

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.is_exhaustion(record):
            return True
        now = self.clock()
        if now - self._last < self.every_s:
            self.suppressed += 1
            return False
        self._last = now
        left_out = self.suppressed
        self.suppressed = 0
        record.msg = (f"out of file descriptors (Too many open files); {left_out} more such errors "
                      "in the last second not shown")
        record.args = ()
        record.exc_info = None
        record.exc_text = None
        record.levelno, record.levelname = logging.ERROR, "ERROR"
        return True


def install_exhaustion_filter() -> DescriptorExhaustion:
    """Put one DescriptorExhaustion on every handler of the root logger (idempotent)."""
    root = logging.getLogger()
    for handler in root.handlers:
        for f in handler.filters:
            if isinstance(f, DescriptorExhaustion):
                return f
    shared = DescriptorExhaustion()
    for handler in root.handlers:
        handler.addFilter(shared)
    return shared


def client_budget(limit: int) -> int:
    """Client connections allowed at once under a descriptor limit: the limit less a reserve
    for site connections, robots.txt fetches and the state files."""
    return max(16, limit - max(64, limit // 4))


@dataclass
class SiteConnection(Generic[C]):
    """A connection to a site (or to the upstream proxy), the client connection it serves, and
    when a request last used it."""

    conn: C
    client_id: str
    last_used: float


class ConnectionBook(Generic[C]):
    """Which connections go first, by id and time: clients still owing a request head (oldest
    first), site connections by last use (least recent first), and a count of the client
    connections closed, by why, for one log line a second."""

    def __init__(self, limit: int, clock: Clock = monotonic):
        self.limit = limit
        self._clock = clock
        self._awaiting_head: OrderedDict[str, None] = OrderedDict()
        self.sites: OrderedDict[str, SiteConnection[C]] = OrderedDict()  # least recently used first
        self._closed: dict[str, int] = {}
        self._cap_warned_at = -float("inf")

    def client_budget(self) -> int:
        return client_budget(self.limit)

    # -- clients ------------------------------------------------------------------------------

    def awaits_head(self, client_id: str) -> None:
        """The client connected (or sent a CONNECT): a complete request head is due."""
        self._awaiting_head[client_id] = None

    def head_arrived(self, client_id: str) -> None:
        self._awaiting_head.pop(client_id, None)

    def evictions(self, open_clients: int) -> Iterator[str]:
        """Past the budget, the clients to close, oldest without a complete head first (never
        the newest: a client that sends its request at once is always served)."""
        while open_clients > self.client_budget() and len(self._awaiting_head) > 1:
            oldest, _ = self._awaiting_head.popitem(last=False)
            yield oldest

    def closed(self, why: str) -> None:
        """A client connection closed for `why`: counted, said in the next `closed_report`."""
        self._closed[why] = self._closed.get(why, 0) + 1

    def closed_report(self) -> list[str]:
        """One line per reason for what was closed since the last report."""
        lines = [f"closed {n} client connection{'' if n == 1 else 's'}: {why}" for why, n in self._closed.items()]
        self._closed.clear()
        return lines

    # -- sites --------------------------------------------------------------------------------

    def site_opened(self, server_id: str, conn: C, client_id: str) -> None:
        self.sites[server_id] = SiteConnection(conn, client_id, self._clock())

    def site_closed(self, server_id: str) -> None:
        self.sites.pop(server_id, None)

    def site_used(self, server_id: str) -> None:
        site = self.sites.get(server_id)
        if site is not None:
            site.last_used = self._clock()
            self.sites.move_to_end(server_id)

    def close_idle(self, more: Callable[[SiteConnection[C]], bool], idle: Callable[[SiteConnection[C]], bool],
                   close: Callable[[SiteConnection[C]], bool], keep: str = "") -> int:
        """Close idle site connections, least recently used first, while `more(site)` says so;
        the number `close` closed."""
        closed = 0
        for key, site in list(self.sites.items()):
            if not more(site):
                break
            if key == keep or not idle(site):
                continue
            self.sites.pop(key, None)
            if close(site):
                closed += 1
        return closed

    def unused_since(self, idle_s: float) -> Callable[[SiteConnection[C]], bool]:
        """`more` for close_idle: a site connection no request used for `idle_s`."""
        limit = self._clock() - idle_s
        return lambda site: site.last_used <= limit

    def warn_cap(self) -> bool:
        """True at most once a minute: every site connection is in use over the cap."""
        now = self._clock()
        if now - self._cap_warned_at > CAP_WARNING_EVERY_S:
            self._cap_warned_at = now
            return True
        return False
