"""`etiquette-proxy run --workers N` (SPEC §3, §10): one supervisor, N proxy processes on one port.

The supervisor takes the listening address first (a socket bound with SO_REUSEPORT; with port
0 it is also how the port is chosen) and keeps it for its whole life, so a restarted worker can
always bind it again. Each worker is an ordinary `etiquette-proxy run` with `--worker I`: it
listens with SO_REUSEPORT on that port too (mitm_patches.share_listening_port: mitmproxy knows
the address as its own, and refuses a request to itself), and they share budgets, pauses and
robots.txt only through Redis (SPEC §10).

Who serves a connection: the kernel's SO_REUSEPORT hash sends each *connection* to one socket
of the group for its whole life, so a crawler's few keep-alive connections split unevenly
(16 wrk connections: 65/35 seen) and one worker runs hot while the other waits. So the
supervisor's socket listens first, a reuseport BPF program (`steer_to_first`) sends every new
connection to it, and the supervisor hands each one on to the next ready worker in turn
(round robin) over a Unix socket pair (SCM_RIGHTS; `receive_connections` in the worker): the
same number of connections on every worker, one listening address. A worker that died is
skipped until it is ready again; its connections in flight die with it. On a kernel without
the program, the hash picks a socket as before, and what reaches the supervisor is handed on
all the same.

- Ready: one ready line (the `run` contract), printed once every worker has printed its own.
- Operator controls: the supervisor writes `proxy-url` and `operator-token` once and removes
  them at stop; every worker accepts the same token (ETIQUETTE_OPERATOR_TOKEN), so
  `etiquette-proxy sites` works through whichever worker the kernel picks.
- A worker that dies is started again after a back-off (operate/workers.RestartBackoff).
- SIGTERM / SIGINT: forwarded to every worker; each drains as a lone proxy does (SPEC §12),
  the supervisor waits for all, removes its files, exits 0.
- Output: a worker's stderr lines are prefixed `wI: `; its stdout (audit lines with
  `--audit-log -`) is passed on whole lines at a time.
No mitmproxy here: the supervisor only starts, watches and stops processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import IO

from etiquette_proxy.operate.controls import TOKEN_ENV, TOKEN_FILE, URL_FILE, new_token, reachable_url, write_private
from etiquette_proxy.operate.workers import RestartBackoff

log = logging.getLogger(__name__)

READY_PREFIX = "etiquette-proxy listening on "
START_TIMEOUT_S = 120.0  # a worker's start-up, generous for a loaded machine
STOP_TIMEOUT_S = 15.0  # a worker's drain (DRAIN_S) and mitmproxy's stop, with room to spare
_PR_SET_PDEATHSIG = 1
LISTEN_BACKLOG = 4096  # as mitm_patches.LISTEN_BACKLOG: a herd waits in the kernel's queue
ACCEPT_BATCH = 100  # connections accepted per readiness event
HANDOFF_FLAG = "--handoff-fd"  # the worker's end of its hand-off socket pair (a hidden `run` option)
_SO_ATTACH_REUSEPORT_CBPF = 51  # Linux asm-generic/socket.h
_BPF_RET_K = 0x06  # BPF_RET | BPF_K


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def steer_to_first(sock: socket.socket) -> None:
    """Every new connection on `sock`'s SO_REUSEPORT group goes to the group's first socket
    (index 0: the first to listen, the supervisor's): a classic BPF program `ret #0`
    (SO_ATTACH_REUSEPORT_CBPF, Linux >= 4.5). OSError where the kernel has no such option."""
    program = (_SockFilter * 1)(_SockFilter(_BPF_RET_K, 0, 0, 0))
    sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_REUSEPORT_CBPF, bytes(_SockFprog(1, program)))


_receiving: dict[int, socket.socket] = {}  # fd -> the socket reading it (one per worker)


def receive_connections(fd: int, handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
                        ) -> socket.socket | None:
    """In a worker: serve every connection the supervisor hands over on the socket pair `fd`
    with `handle`, as asyncio's start_server serves an accepted one (mitmproxy's handler); the
    socket it reads (it owns `fd`), or None when `fd` is served already.
    The supervisor gone (end of file): nothing more arrives (the worker dies with it). Once
    per worker: mitmproxy may start one server per address family, both served from here."""
    served = _receiving.get(fd)
    if served is not None and served.fileno() == fd:
        return None
    loop = asyncio.get_running_loop()
    channel = _receiving[fd] = socket.socket(fileno=fd)
    channel.setblocking(False)

    def receive() -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                data, fds, _, _ = socket.recv_fds(channel, 1, 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data, fds = b"", []
            if not data and not fds:
                loop.remove_reader(channel)
                channel.close()
                return
            for each in fds:
                sock = socket.socket(fileno=each)
                sock.setblocking(False)
                loop.create_task(_serve(sock))

    async def _serve(sock: socket.socket) -> None:
        reader = asyncio.StreamReader(loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, handle, loop=loop)
        try:
            await loop.connect_accepted_socket(lambda: protocol, sock)
        except OSError:
            sock.close()  # gone before it was served: nothing was read from it

    loop.add_reader(channel, receive)
    return channel


def _die_with_parent() -> None:
    """In the worker before exec: SIGTERM when the supervisor dies, even by kill -9 (Linux
    prctl PR_SET_PDEATHSIG), so no worker outlives it holding the port."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def reserve_port(host: str, port: int) -> socket.socket:
    """Bind (never listen) `host:port` with SO_REUSEPORT: the port is ours and every worker's."""
    family, kind, proto, _, address = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


@dataclass
class Worker:
    index: int
    proc: asyncio.subprocess.Process | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    pumps: list[asyncio.Task[None]] = field(default_factory=list)
    channel: socket.socket | None = None  # the supervisor's end of the hand-off socket pair
    handed: int = 0  # connections handed to it


class Supervisor:
    """Starts `count` workers from `command(index, port)`, keeps them running, stops them."""

    def __init__(self, count: int, host: str, port: int, state_dir: str, command: Callable[[int, int], Sequence[str]],
                 out: IO[str] | None = None, err: IO[str] | None = None, clock: Callable[[], float] = time.monotonic):
        self.count, self.host, self.state_dir, self.command = count, host, state_dir, command
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.backoff = RestartBackoff(clock)
        self.token = new_token()
        self._sock = reserve_port(host, port)
        self.port = int(self._sock.getsockname()[1])
        self._sock.listen(LISTEN_BACKLOG)  # first in the port's group: index 0
        self._sock.setblocking(False)
        try:
            steer_to_first(self._sock)
        except OSError as e:
            log.warning("cannot steer new connections to the supervisor (%s): the kernel's hash spreads them", e)
        self.workers = [Worker(i) for i in range(1, count + 1)]
        self.stopping = asyncio.Event()
        self._written: list[str] = []
        self._turn = 0  # the worker to hand the next connection to (round robin)
        self._waiting: list[socket.socket] = []  # accepted while no worker was ready
        self._accepting = False

    @property
    def url(self) -> str:
        return reachable_url(self.host, self.port)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        try:
            # Worker 1 alone first: it creates what the state dir lacks (the CA every client
            # trusts, the SQLite stores) before the others open the same files.
            first, *rest = self.workers
            await self._start(first)
            if not await self._all_ready([first]):
                return 1
            for worker in rest:
                await self._start(worker)
            if not await self._all_ready(rest):
                return 1
            self._announce()
            self._accept_again()
            watchers = [asyncio.create_task(self._watch(w)) for w in self.workers]
            await self.stopping.wait()
            self._stop_accepting()
            for task in watchers:
                task.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
            return 0
        finally:
            self._stop_accepting()
            await self._stop_all()
            self._unannounce()
            for sock in self._waiting:
                sock.close()
            for worker in self.workers:
                self._close_channel(worker)
            self._sock.close()

    # -- starting -------------------------------------------------------------------------------

    async def _start(self, worker: Worker) -> None:
        env = dict(os.environ)
        env[TOKEN_ENV] = self.token
        worker.ready = asyncio.Event()
        self._close_channel(worker)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setblocking(False)
        try:
            worker.proc = await asyncio.create_subprocess_exec(
                *self.command(worker.index, self.port), f"{HANDOFF_FLAG}={theirs.fileno()}",
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                env=env, preexec_fn=_die_with_parent, pass_fds=(theirs.fileno(),))
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()  # the worker's now
        worker.channel = ours
        self.backoff.started(worker.index)
        assert worker.proc.stdout is not None and worker.proc.stderr is not None
        worker.pumps = [asyncio.create_task(self._pump_out(worker, worker.proc.stdout)),
                        asyncio.create_task(self._pump_err(worker, worker.proc.stderr))]

    async def _pump_out(self, worker: Worker, stream: asyncio.StreamReader) -> None:
        """A worker's stdout: its ready line (kept), then whole lines passed on (`--audit-log -`)."""
        while line := await stream.readline():
            if not worker.ready.is_set() and line.startswith(READY_PREFIX.encode()):
                worker.ready.set()
                self._accept_again()  # connections that waited for a ready worker go now
                continue
            self.out.write(line.decode(errors="replace"))
            self.out.flush()

    async def _pump_err(self, worker: Worker, stream: asyncio.StreamReader) -> None:
        prefix = f"w{worker.index}: "
        while line := await stream.readline():
            self.err.write(prefix + line.decode(errors="replace"))
            self.err.flush()

    async def _all_ready(self, workers: list[Worker]) -> bool:
        """Every one of `workers` listening; False (after saying which) when one exits first."""
        async def ready_or_exit(worker: Worker) -> bool:
            assert worker.proc is not None
            ready = asyncio.create_task(worker.ready.wait())
            exited = asyncio.create_task(worker.proc.wait())
            await asyncio.wait({ready, exited}, timeout=START_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
            exited.cancel()
            ready.cancel()
            if worker.ready.is_set():
                return True
            code = worker.proc.returncode
            why = f"exited with code {code}" if code is not None else f"not listening after {START_TIMEOUT_S:g} s"
            log.error("worker %d %s before it listened; stopping", worker.index, why)
            return False

        stop = asyncio.create_task(self.stopping.wait())
        start = asyncio.gather(*(ready_or_exit(w) for w in workers))
        await asyncio.wait({stop, start}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not start.done():
            start.cancel()
            return False
        return all(start.result())

    def _announce(self) -> None:
        """The files `etiquette-proxy sites` finds the proxy by (SPEC §12: 0600), then the one ready line."""
        try:
            write_private(os.path.join(self.state_dir, TOKEN_FILE), self.token + "\n")
            self._written.append(TOKEN_FILE)
            write_private(os.path.join(self.state_dir, URL_FILE), self.url + "\n")
            self._written.append(URL_FILE)
        except OSError as e:
            log.warning("could not write %s: %s (`etiquette-proxy sites` will not find this proxy)",
                        self.state_dir, e)
        pids = ", ".join(str(w.proc.pid) for w in self.workers if w.proc is not None)
        log.info("%d workers listening on %s (pids %s)", self.count, self.url, pids)
        shown = f"[{self.host}]" if ":" in self.host else self.host
        self.out.write(f"{READY_PREFIX}http://{shown}:{self.port}\n")
        self.out.flush()

    def _unannounce(self) -> None:
        for name in self._written:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.state_dir, name))

    # -- keeping them running -------------------------------------------------------------------

    async def _watch(self, worker: Worker) -> None:
        """Start `worker` again whenever it dies, after the back-off, until stopping."""
        while not self.stopping.is_set():
            assert worker.proc is not None
            code = await worker.proc.wait()
            self._close_channel(worker)  # no connection handed to a dead worker
            await asyncio.gather(*worker.pumps, return_exceptions=True)
            if self.stopping.is_set():
                return
            delay = self.backoff.delay_s(worker.index)
            how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
            log.error("worker %d (pid %d) %s; starting it again in %.1f s", worker.index, worker.proc.pid, how,
                      delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), delay)
            if self.stopping.is_set():
                return
            await self._start(worker)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(worker.ready.wait(), START_TIMEOUT_S)
            if worker.ready.is_set():
                log.warning("worker %d started again (pid %d)", worker.index, worker.proc.pid)

    # -- handing connections on ------------------------------------------------------------------

    def _accept_again(self) -> None:
        """Accept (again): hand on what waited, then read the listening socket when it is ready."""
        if self.stopping.is_set():
            return
        while self._waiting:
            if not self._hand_off(self._waiting[0]):
                return
            self._waiting.pop(0).close()
        if not self._accepting:
            asyncio.get_running_loop().add_reader(self._sock, self._accept)
            self._accepting = True

    def _stop_accepting(self) -> None:
        if self._accepting:
            asyncio.get_running_loop().remove_reader(self._sock)
            self._accepting = False

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of descriptors, a reset before accept: the next one
                log.debug("accept: %s", e)
                return
            if self._hand_off(conn):
                conn.close()  # the worker's copy serves it
                continue
            # No worker ready (all restarting): hold it, and the rest in the kernel's queue.
            self._waiting.append(conn)
            self._stop_accepting()
            return

    def _hand_off(self, conn: socket.socket) -> bool:
        """Give `conn` to the next ready worker in turn; False when none can take it."""
        count = len(self.workers)
        for step in range(count):
            worker = self.workers[(self._turn + step) % count]
            if worker.channel is None or not worker.ready.is_set():
                continue
            try:
                socket.send_fds(worker.channel, [b"c"], [conn.fileno()])
            except (BlockingIOError, InterruptedError):
                continue  # its queue is full: busy, the next one takes it
            except OSError:
                self._close_channel(worker)  # died: skipped until started again
                continue
            worker.handed += 1
            self._turn = (self._turn + step + 1) % count
            return True
        return False

    @staticmethod
    def _close_channel(worker: Worker) -> None:
        if worker.channel is not None:
            worker.channel.close()
            worker.channel = None

    # -- stopping -------------------------------------------------------------------------------

    async def _stop_all(self) -> None:
        """SIGTERM to every worker (each drains, SPEC §12), wait, SIGKILL what is left."""
        live = [w.proc for w in self.workers if w.proc is not None and w.proc.returncode is None]
        for proc in live:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        if live:
            _, late = await asyncio.wait([asyncio.create_task(p.wait()) for p in live], timeout=STOP_TIMEOUT_S)
            if late:
                for proc in live:
                    if proc.returncode is None:
                        log.error("worker pid %d still running %g s after SIGTERM; killing it", proc.pid,
                                  STOP_TIMEOUT_S)
                        with contextlib.suppress(ProcessLookupError):
                            proc.kill()
                await asyncio.gather(*(p.wait() for p in live))
        for worker in self.workers:
            await asyncio.gather(*worker.pumps, return_exceptions=True)


def supervise(count: int, host: str, port: int, state_dir: str, command: Callable[[int, int], Sequence[str]]) -> int:
    """Run the supervisor until SIGTERM/SIGINT; 0 after a clean stop, 2 when the port is taken."""
    async def main() -> int:
        try:
            supervisor = Supervisor(count, host, port, state_dir, command)
        except OSError as e:
            print(f"etiquette-proxy run: cannot listen on {host}:{port}: {e.strerror} "
                  "(expected a free port, or --listen-port 0)", file=sys.stderr)
            return 2
        return await supervisor.run()

    return asyncio.run(main())
