"""Held herds (SPEC §5, issue 11 item 3): many requests held at once, released one by one.

Three scenarios through the real proxy process, each against `benchmarks/site.py`, whose own
request log is the truth (asyncio client, one connection and one request each, sent
`--spacing` apart in a known order; every wait bounded):

- `one`:    N requests for one site at `--rate` (burst 10, max_concurrency 16: slots to spare,
            so the rate binds and not the proxy's own latency), max_hold 5m:
            all should be answered 200, the site should see the rate (within 5 %), in order.
- `hold60`: the same with the default max_hold (60 s): the requests whose place in line is
            beyond 60 s are answered 503 at once (the reason says the expected wait), the
            others at the rate.
- `spread`: N requests spread over `--sites` sites (each its own port) at `--site-rate`.
- `free`:   the baseline: the same N requests for one site, none held (rate 1e6), for the
            proxy's CPU per request without holding.

Figures: answers, the delivered rate at the site (steady part, burst excluded), the largest
displacement from the sending order, the proxy's CPU per release while the herd is held (from
/proc/PID/stat, measured after the last request was sent), its peak RSS, and how long the
refused waited for their 503.

    python benchmarks/held.py                  # all three at N=10,000 (about 5 minutes)
    python benchmarks/held.py --quick          # a smoke version in a few seconds
    python benchmarks/held.py --scenario one --n 2000 --rate 50
    python benchmarks/held.py --scenario spread --redis   # two proxies on one redis-server

`--redis` runs the scenario with `state.backend: redis` (SPEC §10): a redis-server of its own
(Debian's, on a free loopback port, no persistence, stopped by its PID) and `--proxies`
proxy processes (2 by default) sharing it, the herd sent to them in turn, as crawler machines
sharing one budget per site would; CPU and RSS are the proxies' summed.

The soft file-descriptor limit is raised to the hard limit here and, through a preexec_fn,
for the proxy (10,000 client connections need 10,000+ descriptors).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._harness import HERE, clean_env, etiquette_command, free_port, header  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
WARM_SPACING_S = 0.02  # between two warm-up requests (one per site)


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# -- processes -------------------------------------------------------------------------------

@dataclass
class Proc:
    proc: subprocess.Popen[str]
    lines: list[str]

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM this process (by PID), SIGKILL after `grace` seconds."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def _read_lines(proc: subprocess.Popen[str], prefix: str, count: int, timeout: float) -> list[str]:
    assert proc.stdout is not None
    out: list[str] = []
    done = threading.Event()

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(prefix):
                out.append(line.strip().rsplit(" ", 1)[-1])
                if len(out) == count:
                    break
        done.set()

    threading.Thread(target=reader, daemon=True).start()
    if not done.wait(timeout) or len(out) < count:
        proc.kill()
        proc.wait(5)
        raise RuntimeError(f"pid {proc.pid}: {len(out)} of {count} {prefix!r} lines in {timeout}s")
    return out


def start_site(ports: int, log: Path) -> Proc:
    proc = subprocess.Popen([sys.executable, str(HERE / "site.py"), "--ports", str(ports), "--log", str(log)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=clean_env(),
                            preexec_fn=raise_fd_limit)
    return Proc(proc, _read_lines(proc, "site listening on ", ports, 60))


def start_redis(directory: Path) -> tuple[Proc, str]:
    """A redis-server of our own on a free loopback port (no persistence); its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("--redis needs redis-server (Debian's package: ./run-tests installs it)")
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    with open(directory / "redis.log", "ab") as out:
        proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                                 "no", "--dir", str(directory)], stdout=out, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # bounded: it answers PING within a few ms when up
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return Proc(proc, []), f"redis://127.0.0.1:{port}/0"
        except OSError:
            pass
        time.sleep(0.05)
    Proc(proc, []).stop()
    raise RuntimeError(f"redis-server did not answer on port {port}")


def start_proxy(state_dir: Path, sets: list[str]) -> Proc:
    state_dir.mkdir(parents=True, exist_ok=True)
    stderr = open(state_dir.parent / "proxy.stderr", "ab")
    proc = subprocess.Popen(etiquette_command(state_dir, sets), stdout=subprocess.PIPE, stderr=stderr,
                            text=True, env=clean_env(), preexec_fn=raise_fd_limit)
    stderr.close()
    return Proc(proc, _read_lines(proc, "etiquette-proxy listening on ", 1, 60))


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# -- the herd --------------------------------------------------------------------------------

@dataclass
class Answer:
    status: int
    took_s: float
    reason: str = ""


@dataclass
class Herd:
    answers: list[Answer] = field(default_factory=list)
    started_at: float = 0.0    # monotonic: the first request sent
    sent_at: float = 0.0       # monotonic: the last request sent
    cpu_at_start: float = 0.0
    cpu_after_sent: float = 0.0
    cpu_at_end: float = 0.0
    end_at: float = 0.0
    peak_rss: float = 0.0


async def one_request(port: int, url: str, timeout: float) -> Answer:
    t0 = time.monotonic()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 30)
    except (TimeoutError, OSError) as e:
        return Answer(0, time.monotonic() - t0, f"connect: {e!r}")
    try:
        host = url.split("/")[2]
        writer.write(f"GET {url} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), timeout)
    except (TimeoutError, OSError) as e:
        return Answer(0, time.monotonic() - t0, f"read: {e!r}")
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    parts = head.split(None, 2)
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    return Answer(status, time.monotonic() - t0, body.decode(errors="replace").strip() if status != 200 else "")


async def run_herd(ports: list[int], pids: list[int], urls: list[str], spacing: float, timeout: float,
                   max_seconds: float, sites: int = 1) -> Herd:
    """The requests (to `sites` sites in turn) sent `spacing` apart, to the proxies' ports in
    turn; CPU and RSS summed."""
    herd = Herd()
    stop = asyncio.Event()

    def cpu() -> float:
        return sum(cpu_s(pid) for pid in pids)

    async def watch_rss() -> None:
        while not stop.is_set():
            herd.peak_rss = max(herd.peak_rss, sum(rss_mb(pid) for pid in pids))
            await asyncio.sleep(0.5)

    watcher = asyncio.create_task(watch_rss())
    tasks = []
    herd.started_at = time.monotonic()
    herd.cpu_at_start = cpu()
    deadline = herd.started_at + max_seconds
    for i, url in enumerate(urls):
        # to the proxies in turn, and each site's requests through every proxy in turn (with
        # `sites` even and two proxies, i % 2 alone would send each site through one proxy)
        tasks.append(asyncio.create_task(one_request(ports[(i % sites + i // sites) % len(ports)], url, timeout)))
        await asyncio.sleep(spacing)
        if time.monotonic() > deadline:
            break
    herd.sent_at = time.monotonic()
    herd.cpu_after_sent = cpu()
    done, pending = await asyncio.wait(tasks, timeout=max(1.0, deadline - time.monotonic()))
    herd.end_at = time.monotonic()
    herd.cpu_at_end = cpu()
    for t in pending:
        t.cancel()
    stop.set()
    await watcher
    herd.answers = [t.result() if t in done and not t.cancelled() else Answer(0, 0.0, "not answered in time")
                    for t in tasks]
    return herd


# -- the figures -----------------------------------------------------------------------------

def read_log(path: Path) -> list[tuple[float, int, str]]:
    out = []
    for line in path.read_text().splitlines():
        t, port, target = line.split(" ", 2)
        out.append((float(t), int(port), target))
    return out


def displacement(order: list[int]) -> int:
    """The largest distance between where a request reached the site and where it was sent."""
    rank = {i: r for r, i in enumerate(sorted(order))}
    return max((abs(pos - rank[i]) for pos, i in enumerate(order)), default=0)


def steady_rate(times: list[float], burst: int) -> float:
    if len(times) <= burst + 1:
        return float("nan")
    times = sorted(times)
    return (len(times) - 1 - burst) / (times[-1] - times[0])


def report(name: str, herd: Herd, arrivals: list[tuple[float, int, str]], rate: float, burst: int,
           rss_idle: float) -> dict[str, float]:
    answers = herd.answers
    codes: dict[int, int] = {}
    for a in answers:
        codes[a.status] = codes.get(a.status, 0) + 1
    pages = [(t, port, target) for t, port, target in arrivals if target.startswith("/h")]
    order = [int(target[2:]) for _, _, target in pages]
    per_port: dict[int, list[float]] = {}
    for t, port, _ in pages:
        per_port.setdefault(port, []).append(t)
    served = [i for i, a in enumerate(answers) if a.status == 200]
    reached_refused = len(set(order) - set(served))
    releases_after = sum(1 for t, _, _ in pages if herd.sent_at + 1.0 <= t <= herd.end_at)
    cpu = herd.cpu_at_end - herd.cpu_after_sent
    refused = [a for a in answers if a.status == 503]
    print(f"-- {name}")
    print(f"  answers: {dict(sorted(codes.items()))} of {len(answers)}; sent over "
          f"{herd.sent_at - herd.started_at:.1f}s, all answered after {herd.end_at - herd.started_at:.1f}s")
    failed = [a.reason.split(":", 1)[0] + ": " + a.reason.split("(", 1)[0].split(":", 1)[-1].strip()
              for a in answers if a.status == 0]
    if failed:
        kinds: dict[str, int] = {}
        for f in failed:
            kinds[f] = kinds.get(f, 0) + 1
        print(f"  no answer (client side): {dict(sorted(kinds.items(), key=lambda kv: -kv[1])[:4])}")
    print(f"  at the site: {len(pages)} requests; {reached_refused} of them answered non-200 to the client")
    if len(per_port) == 1:
        delivered = steady_rate(next(iter(per_port.values())), burst)
        print(f"  delivered rate (site log, burst excluded): {delivered:.2f}/s for {rate:g}/s "
              f"({100 * (delivered / rate - 1):+.1f} %)")
    else:
        rates = [steady_rate(ts, burst) for ts in per_port.values() if len(ts) > burst + 1]
        gaps = [b - a for ts in per_port.values() for a, b in zip(sorted(ts), sorted(ts)[1:], strict=False)]
        delivered = statistics.median(rates) if rates else float("nan")
        short = sum(g < 0.9 / rate for g in gaps)
        print(f"  {len(per_port)} sites; per-site delivered rate median {delivered:.3f}/s for {rate:g}/s; "
              f"smallest gap between two requests to one site {min(gaps, default=0):.2f}s "
              f"(interval {1 / rate:.2f}s; {short} of {len(gaps)} gaps < 90 % of it)")
        order_by_site: dict[int, list[int]] = {}
        for _, port, target in pages:
            order_by_site.setdefault(port, []).append(int(target[2:]))
        print(f"  largest displacement within one site: {max(displacement(o) for o in order_by_site.values())}")
    if len(per_port) == 1:
        print(f"  largest displacement from the sending order: {displacement(order)} places")
    per_release = 1000 * cpu / releases_after if releases_after else float("nan")
    print(f"  proxy CPU after the last send: {cpu:.2f}s for {releases_after} releases = "
          f"{per_release:.2f} ms per release (each forwarded through mitmproxy too)")
    total = 1000 * (herd.cpu_at_end - herd.cpu_at_start) / max(1, len(answers))
    print(f"  proxy CPU over the whole herd: {total:.2f} ms per request (compare `free`: none held)")
    print(f"  proxy RSS: {rss_idle:.0f} MB idle, {herd.peak_rss:.0f} MB peak")
    if refused:
        took = sorted(a.took_s for a in refused)
        print(f"  503s answered after: median {statistics.median(took):.2f}s, max {took[-1]:.2f}s; "
              f"e.g. {refused[0].reason.splitlines()[0][:160]!r}")
        print(f"                       last: {refused[-1].reason.splitlines()[0][:160]!r}")
    waits = sorted(answers[i].took_s for i in served)
    if waits:
        print(f"  200s answered after: median {statistics.median(waits):.1f}s, max {waits[-1]:.1f}s")
    sys.stdout.flush()
    return {"delivered": delivered, "displacement": float(displacement(order)), "per_release_ms": per_release,
            "per_request_ms": total}


def scenario(name: str, n: int, sites: int, rate: float, burst: int, concurrency: int, hold: str | None,
             spacing: float, max_seconds: float, work: Path, redis: bool = False,
             proxies: int = 1) -> dict[str, float]:
    log = work / f"{name}.site.log"
    site = start_site(sites, log)
    sets = [f"pacing.rate={rate:f}", f"pacing.burst={burst}", f"pacing.max_concurrency={concurrency}"]
    if hold is not None:
        sets.append(f"pacing.max_hold={hold}")
    server: Proc | None = None
    started: list[Proc] = []
    try:
        if redis:
            server, url = start_redis(work / f"{name}.redis")
            sets += ["state.backend=redis", f"state.url={url}"]
        for k in range(proxies):
            started.append(start_proxy(work / f"{name}.{k}" / "state", sets))
        ports = [int(p.lines[0].rsplit(":", 1)[1]) for p in started]
        pids = [p.proc.pid for p in started]
        bases = site.lines
        # robots.txt first (one request per site), so the herd meets a settled gate; sent 20 ms
        # apart: a thousand robots.txt fetches at once kept a loaded machine's proxies from
        # reading Redis's answers within its 2 s call timeout (503: Redis unreachable).
        warm = asyncio.run(run_herd(ports, pids, [f"{b}/warm" for b in bases], WARM_SPACING_S, 60, 120))
        assert all(a.status == 200 for a in warm.answers), [a for a in warm.answers if a.status != 200][:3]
        time.sleep(max(1.0, burst / rate))  # the bucket refills
        rss_idle = sum(rss_mb(pid) for pid in pids)
        urls = [f"{bases[i % sites]}/h{i}" for i in range(n)]
        shared = f", {proxies} proxies on one redis-server" if redis else ""
        print(f"   {name}: {n} requests to {sites} site(s), rate {rate:g}/s, burst {burst}, "
              f"max_concurrency {concurrency}, max_hold {hold or 'default (60s)'}, spacing {spacing * 1000:g} ms"
              f"{shared}", flush=True)
        herd = asyncio.run(run_herd(ports, pids, urls, spacing, timeout=max_seconds, max_seconds=max_seconds,
                                    sites=sites))
    finally:
        for proxy in started:
            proxy.stop()
        if server is not None:
            server.stop()
        site.stop()
    return report(name, herd, read_log(log), rate, burst, rss_idle)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke run in a few seconds")
    p.add_argument("--scenario", choices=["free", "one", "hold60", "spread", "all"], default="all")
    p.add_argument("--n", type=int, help="requests per scenario (10,000; 300 with --quick)")
    p.add_argument("--rate", type=float, default=100.0)
    p.add_argument("--sites", type=int, default=1000)
    p.add_argument("--site-rate", type=float, default=0.1)
    p.add_argument("--spacing", type=float, default=0.002, help="seconds between two sends")
    p.add_argument("--max-seconds", type=float, default=400.0, help="bound per scenario")
    p.add_argument("--redis", action="store_true", help="state.backend: redis, a redis-server of its own")
    p.add_argument("--proxies", type=int, help="proxy processes sharing the herd (2 with --redis, else 1)")
    a = p.parse_args()
    proxies = a.proxies or (2 if a.redis else 1)
    if proxies < 1 or (proxies > 1 and not a.redis):
        p.error("--proxies above 1 needs --redis (unshared proxies would each keep their own budget)")
    shared = {"redis": a.redis, "proxies": proxies}
    if a.quick:
        a.sites, a.site_rate, a.max_seconds = 30, 5.0, 60.0
    a.n = a.n or (300 if a.quick else 10_000)
    raise_fd_limit()
    header("held herds: N requests held for one site, or spread over many (SPEC §5)")
    print(f"fd limit {resource.getrlimit(resource.RLIMIT_NOFILE)}; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} (a shared machine)", flush=True)
    if shutil.which("etiquette-proxy", path=str(Path(sys.executable).parent)) is None:
        sys.exit("etiquette-proxy is not installed in this venv (./run-tests creates it)")
    work = Path(tempfile.mkdtemp(prefix="held-"))
    try:
        if a.scenario in ("free", "all"):
            # The baseline: the same requests, none held (a rate the proxy cannot reach).
            scenario("free", a.n, 1, 1_000_000, 10, 10_000, "5m", a.spacing, a.max_seconds, work, **shared)
        if a.scenario in ("one", "all"):
            scenario("one", a.n, 1, a.rate, 10, 16, "5m", a.spacing, a.max_seconds, work, **shared)
        if a.scenario in ("hold60", "all"):
            scenario("hold60", a.n, 1, a.rate, 10, 16, "1s" if a.quick else None, a.spacing, a.max_seconds,
                     work, **shared)
        if a.scenario in ("spread", "all"):
            scenario("spread", a.n, a.sites, a.site_rate, 1, 2, "5m", a.spacing, a.max_seconds, work, **shared)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
