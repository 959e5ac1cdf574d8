"""Large bodies: throughput and resident memory of etiquette-proxy against bare mitmproxy
streaming the same bodies (SPEC §12: bodies of any size pass without being held in memory).

    python benchmarks/large_bodies.py [--big-mb 1024] [--each-mb 100] [--parallel 8] [--rounds 3]
        [--no-mitmdump] [--before DIR]

One run, three arms on one local site (this script, `--serve`: an asyncio site that makes each
body as it sends it, Content-Length framed, never on disk):
- direct: curl straight to the site (what the machine can do at all);
- lean: the leanest mitmproxy (benchmarks/_lean_master.py: core, proxyserver, next_layer,
  tlsconfig, no code of ours) with `stream_large_bodies=1m`: the floor (issue 36);
- mitmdump: bare mitmdump, quiet, `--set stream_large_bodies=1m` (mitmproxy streaming bodies
  above 1 MiB, no addon of ours; `--no-mitmdump` leaves it out);
- etiquette-proxy: the real proxy (fast pacing, so pacing does not hold the downloads);
- `--before DIR`: the real proxy of another checkout (`git worktree add /tmp/before main`, or
  `git archive BASE` unpacked; its packages linked and checked as overhead.py does): a change's
  before/after from one run, under the same load.
Two loads per arm: 1 x `--big-mb` MB, then `--parallel` x `--each-mb` MB at once. Clients are
curl processes (`-o /dev/null`), so the client's own cost stays out of the proxy's figures.
Per load: wall time, aggregate MB/s, median time to first byte, the proxy's VmRSS before,
at its peak (sampled every 20 ms) and 2 s after, and its CPU seconds per GB (/proc; "loop"
the event loop's thread alone, the one every byte waits for). Rounds
interleave the arms, then medians, and etiquette-proxy's MB/s over the lean proxy's per load
(target, issue 36: >= 0.8 for the same body), with the machine's load average.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from _harness import (
    Started,
    _ready_line,
    clean_env,
    check,
    checkout_path,
    cpu_seconds,
    header,
    load_average,
    start_etiquette,
    start_lean,
    start_mitmdump,
    started,
)

MB = 1024 * 1024
BLOCK = os.urandom(256 * 1024)
LEAN = "lean mitmproxy, stream_large_bodies=1m"
ETIQUETTE = "etiquette-proxy"
BEFORE = "etiquette-proxy before (--before)"
FAST = ["pacing.rate=1000", "pacing.burst=100", "pacing.max_concurrency=64"]


# -- the site (--serve) ---------------------------------------------------------------------------

async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            target = head.split(b" ", 2)[1]
            path = target.split(b"?", 1)[0].rsplit(b"/", 1)[-1]
            if not path.isdigit():  # robots.txt and anything else: 404, everything allowed
                writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
                continue
            size = int(path)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                         b"Content-Length: %d\r\n\r\n" % size)
            left = size
            while left > 0:
                chunk = BLOCK if left >= len(BLOCK) else BLOCK[:left]
                writer.write(chunk)
                left -= len(chunk)
                await writer.drain()  # bounded: the site never holds more than a block or two
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _serve() -> None:
    server = await asyncio.start_server(_handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(f"site listening on http://127.0.0.1:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()


def start_site() -> Started:
    proc = subprocess.Popen([sys.executable, __file__, "--serve"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=clean_env())
    return Started("site", proc, _ready_line(proc, "site listening on "))


# -- measuring -------------------------------------------------------------------------------------

def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def loop_seconds(pid: int) -> float:
    """User + system CPU time of the process's main thread (the event loop), seconds."""
    with open(f"/proc/{pid}/task/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Peak:
    """The peak VmRSS of `pid`, sampled every 20 ms while the `with` block runs."""

    def __init__(self, pid: int | None):
        self.pid, self.peak, self._stop = pid, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while self.pid is not None and not self._stop.wait(0.02):
            self.peak = max(self.peak, rss_mb(self.pid))

    def __enter__(self) -> Peak:
        if self.pid is not None:
            self.peak = rss_mb(self.pid)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def curl(url: str, proxy: str | None) -> subprocess.Popen[str]:
    cmd = ["curl", "-s", "-o", "/dev/null", "--max-time", "600",
           "-w", "%{http_code} %{size_download} %{time_starttransfer}"]
    cmd += ["-x", proxy] if proxy else ["--noproxy", "*"]
    return subprocess.Popen([*cmd, url], stdout=subprocess.PIPE, text=True, env=clean_env())


@dataclass
class Figures:
    wall_s: float
    mb_s: float
    first_ms: float
    rss_before: float
    rss_peak: float
    rss_after: float
    complete: bool
    cpu_s_per_gb: float = float("nan")  # the proxy's utime+stime per GB moved
    loop_s_per_gb: float = float("nan")  # the same, of its main thread (the event loop) alone

    def line(self, count: int, size_mb: int) -> str:
        memory = (f"RSS {self.rss_before:5.0f} -> peak {self.rss_peak:5.0f} (+{self.rss_peak - self.rss_before:3.0f}) "
                  f"-> after {self.rss_after:5.0f} MB") if self.rss_before == self.rss_before else "RSS -"
        cpu = (f", CPU {self.cpu_s_per_gb:5.2f} s/GB (loop {self.loop_s_per_gb:4.2f})"
               if self.cpu_s_per_gb == self.cpu_s_per_gb else "")
        return (f"{count} x {size_mb:>4} MB: {self.wall_s:6.2f} s, {self.mb_s:7.1f} MB/s, first byte "
                f"{self.first_ms:6.1f} ms, {memory}{cpu}{'' if self.complete else '  INCOMPLETE'}")


def load(site: str, proxy: Started | None, count: int, size_mb: int) -> Figures:
    """`count` downloads of `size_mb` MB at once through `proxy` (None: direct)."""
    pid = proxy.pid if proxy else None
    before = rss_mb(pid) if pid else float("nan")
    cpu0 = cpu_seconds(pid) if pid else 0.0
    loop0 = loop_seconds(pid) if pid else 0.0
    with Peak(pid) as peak:
        t0 = time.monotonic()
        clients = [curl(f"{site}/{size_mb * MB}?n={i}", proxy.url if proxy else None) for i in range(count)]
        outs = [c.communicate(timeout=900)[0].split() for c in clients]
        wall = time.monotonic() - t0
    gb = count * size_mb / 1024
    cpu = (cpu_seconds(pid) - cpu0) / gb if pid else float("nan")
    loop = (loop_seconds(pid) - loop0) / gb if pid else float("nan")
    if pid:
        time.sleep(2)
    after = rss_mb(pid) if pid else float("nan")
    complete = all(o[0] == "200" and int(o[1]) == size_mb * MB for o in outs)
    first_ms = statistics.median(float(o[2]) for o in outs) * 1000
    return Figures(wall, count * size_mb / wall, first_ms, before, peak.peak if pid else float("nan"), after, complete,
                   cpu, loop)


def summary(name: str, runs: list[Figures], count: int, size_mb: int) -> str:
    """Medians over the rounds; the peak is the highest of any round."""
    def med(key: str) -> float:
        return statistics.median(getattr(r, key) for r in runs)
    worst = max(runs, key=lambda r: r.rss_peak - r.rss_before)
    return f"  {name:<40} " + Figures(med("wall_s"), med("mb_s"), med("first_ms"), worst.rss_before, worst.rss_peak,
                                       worst.rss_after, all(r.complete for r in runs),
                                       med("cpu_s_per_gb"), med("loop_s_per_gb")).line(count, size_mb)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--big-mb", type=int, default=1024, help="the single large body, MB (default 1024)")
    ap.add_argument("--each-mb", type=int, default=100, help="each of the parallel bodies, MB (default 100)")
    ap.add_argument("--parallel", type=int, default=8, help="downloads at once (default 8)")
    ap.add_argument("--rounds", type=int, default=3, help="each load this many times per arm, interleaved (default 3)")
    ap.add_argument("--no-mitmdump", action="store_true", help="leave the bare mitmdump arm out")
    ap.add_argument("--before", metavar="DIR", help="an arm of another checkout's etiquette-proxy (see above)")
    args = ap.parse_args()
    if args.serve:
        asyncio.run(_serve())
        return
    header("large bodies: etiquette-proxy against bare mitmproxy streaming (SPEC §12)")
    scratch = Path(tempfile.mkdtemp(prefix="large-bodies-"))
    site = start_site()
    with started(site):
        arms: list[tuple[str, Started | None]] = [("direct", None)]
        lean = start_lean(scratch / "lean", ["--stream-large-bodies", "1m"])
        mitm = None if args.no_mitmdump else start_mitmdump(scratch / "mitmdump", ["--set", "stream_large_bodies=1m"])
        etq = start_etiquette(scratch / "etiquette", FAST)
        before = None
        if args.before:
            before = start_etiquette(scratch / "before", FAST,
                                     pythonpath=checkout_path(Path(args.before), scratch / "before-path"))
            rev = subprocess.run(["git", "-C", args.before, "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True, timeout=5).stdout.strip() or "not a git checkout"
            print(f"{BEFORE}: the proxy of {Path(args.before).resolve()} (commit {rev})", flush=True)
        with started(*(p for p in (lean, mitm, etq, before) if p is not None)):
            arms += [(LEAN, lean), *([] if mitm is None else [("mitmdump --set stream_large_bodies=1m", mitm)]),
                     (ETIQUETTE, etq), *([] if before is None else [(BEFORE, before)])]
            for _, proxy in arms:
                if proxy is not None:  # warm: robots.txt fetched, first connection made
                    curl(f"{site.url}/1024", proxy.url).communicate(timeout=60)
            loads = [(1, args.big_mb), (args.parallel, args.each_mb)]
            results: dict[tuple[str, int], list[Figures]] = {}
            for r in range(args.rounds):  # arms interleaved, order alternating: a busy machine hits them alike
                for name, proxy in arms if r % 2 == 0 else arms[::-1]:
                    for i, (count, size_mb) in enumerate(loads):
                        figures = load(site.url, proxy, count, size_mb)
                        results.setdefault((name, i), []).append(figures)
                        print(f"  round {r + 1} {name:<40} {figures.line(count, size_mb)}", flush=True)
            print(f"medians over {args.rounds} round(s) (RSS: the round with the largest growth):")
            for i, (count, size_mb) in enumerate(loads):
                for name, _ in arms:
                    print(summary(name, results[(name, i)], count, size_mb))
            print(f"over the lean mitmproxy, same bodies (median of the rounds' own ratios); {load_average()}:")
            for name in (ETIQUETTE, *([] if before is None else [BEFORE])):
                print(f"{name}:")
                for i, (count, size_mb) in enumerate(loads):
                    ratios = sorted(e.mb_s / b.mb_s for e, b in zip(results[(name, i)], results[(LEAN, i)],
                                                                     strict=True))
                    ratio = statistics.median(ratios)
                    print(check(f"{count} x {size_mb} MB: MB/s >= 0.8 of the lean proxy's", ratio >= 0.8,
                                f"{ratio:.3f} (rounds {', '.join(f'{r:.3f}' for r in ratios)})"))

if __name__ == "__main__":
    main()
