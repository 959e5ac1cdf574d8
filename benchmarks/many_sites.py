"""Many sites through the real proxy: resident memory and CPU per request at N sites (issue 17).

`scale.py sites` measures the core's per-site state in one process; this measures the product:
the real `etiquette-proxy run` process, every addon on, crawling N distinct sites R times each
in rotation (request i goes to site i mod N: every site is revisited only after all others, the
hardest order for a bounded memory). Its resident memory after the crawl is what an operator
sees; the bytes per site between two sizes are its slope.

The N sites are host names (`site<k>.example`), answered by one local site farm
(benchmarks/site.py, which serves robots.txt and pages for any absolute-form target) that both
proxies reach as their upstream proxy: (c) `etiquette-proxy run` with `upstream.proxy`, which
sends its own robots.txt fetches the same way, and (b) bare `mitmdump --mode upstream:`. No
name is ever resolved and nothing leaves loopback. Pacing is out of the way (rate and burst
100000 for every site), so nothing is held: the figures are the work and the memory.

The load is this script's own asyncio client: C connections at a time, exactly N x R requests
(wrk cannot stop after a count), absolute-form targets, every answer read to its end; a
connection carries PER_CONNECTION requests, then is replaced (see there why). Per arm:
elapsed, requests/s, proxy CPU ms per request (/proc), the proxy's RSS before and after (VmRSS)
and its peak (VmHWM); for (c) the audit log's outcomes (the requests went through the chain).

    python benchmarks/many_sites.py [--sites 1000,20000] [--requests 3] [--connections 16]
                                    [--arms b,c] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (  # noqa: E402
    Started,
    audit_summary,
    cpu_seconds,
    header,
    start_etiquette,
    start_mitmdump,
    start_site,
    started,
)

FAST_PACING = ("pacing.rate=100000", "pacing.burst=100000", "pacing.max_concurrency=1000")
DEADLINE_S = 3600.0  # one arm's crawl stops by itself after this, whatever N and R
# mitmproxy 11 in upstream mode opens one upstream connection per distinct host a client
# connection asks for, and the sixth stalls (seen here: five hosts in turn on one connection
# go on for ever, six hang at the sixth; bare mitmdump as well). So a client connection
# carries at most this many requests (distinct sites, in rotation), then a new one is opened:
# both arms alike.
PER_CONNECTION = 4


def status_kb(pid: int, field: str) -> int:
    """A /proc/PID/status field in kB (VmRSS, VmHWM)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> int:
    """Send one request, read its answer to the end; the status code."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
        elif name.strip().lower() == b"transfer-encoding":
            raise RuntimeError("chunked answer: the farm and the proxy send lengths")
    if length and status not in (204, 304):
        await reader.readexactly(length)
    return status


async def crawl(proxy: str, sites: int, rounds: int, connections: int) -> tuple[float, dict[int, int]]:
    """N x R requests over `connections` keep-alive connections; (seconds, statuses)."""
    host, port = proxy.rsplit("/", 1)[-1].split(":")
    total = sites * rounds
    next_i = 0
    statuses: dict[int, int] = {}
    deadline = time.monotonic() + DEADLINE_S

    async def worker() -> None:
        nonlocal next_i
        reader, writer = await asyncio.open_connection(host, int(port), limit=1 << 20)
        used = 0
        try:
            while next_i < total and time.monotonic() < deadline:
                if used == PER_CONNECTION:
                    writer.close()
                    reader, writer = await asyncio.open_connection(host, int(port), limit=1 << 20)
                    used = 0
                used += 1
                i = next_i
                next_i += 1
                site, page = i % sites, i // sites
                request = (f"GET http://site{site}.example/page/{page} HTTP/1.1\r\n"
                           f"Host: site{site}.example\r\nUser-Agent: benchbot/1.0\r\n"
                           f"Accept: */*\r\n\r\n").encode()
                status = await _exchange(reader, writer, request)
                statuses[status] = statuses.get(status, 0) + 1
        finally:
            writer.close()

    t0 = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(connections)))
    return time.monotonic() - t0, statuses


def run_arm(arm: str, tmp: Path, farm: Started, sites: int, rounds: int, connections: int,
            sets: list[str]) -> dict[str, object]:
    if arm == "b":
        proxy = start_mitmdump(tmp / "mitm", ["--mode", f"upstream:{farm.url}"])
        state = None
    else:
        state = tmp / "state"
        proxy = start_etiquette(state, [*FAST_PACING, f"upstream.proxy={farm.url}", *sets])
    with started(proxy):
        # One request first (imports, first robots.txt, the first connection): the base.
        asyncio.run(crawl(proxy.url, 1, 1, 1))
        rss0 = status_kb(proxy.pid, "VmRSS")
        cpu0 = cpu_seconds(proxy.pid)
        elapsed, statuses = asyncio.run(crawl(proxy.url, sites, rounds, connections))
        cpu = cpu_seconds(proxy.pid) - cpu0
        done = sum(statuses.values())
        out: dict[str, object] = {
            "arm": arm, "sites": sites, "requests": done, "seconds": round(elapsed, 1),
            "rps": round(done / elapsed, 1), "cpu_ms_per_request": round(1000 * cpu / max(1, done), 3),
            "rss0_mb": round(rss0 / 1024, 1), "rss_mb": round(status_kb(proxy.pid, "VmRSS") / 1024, 1),
            "hwm_mb": round(status_kb(proxy.pid, "VmHWM") / 1024, 1),
            "statuses": dict(sorted(statuses.items())),
        }
        if state is not None:
            out["audit"] = audit_summary(state / "audit.jsonl")
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sites", default="1000,20000", help="comma-separated site counts")
    ap.add_argument("--requests", type=int, default=3, help="requests per site, in rotation")
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--arms", default="b,c", help="b: bare mitmdump, c: etiquette-proxy")
    ap.add_argument("--set", action="append", default=[], help="an extra KEY=VALUE for (c)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sites.split(",")]
    if not all(1 <= n <= 1_000_000 for n in sizes) or not 1 <= args.requests <= 100:
        ap.error("sites in 1..1M, requests in 1..100")
    header("many sites through the real proxy: memory and CPU per request")
    print(f"-- {args.requests} requests per site in rotation, {args.connections} connections, "
          f"arms {args.arms}; pacing out of the way ({', '.join(FAST_PACING)})")
    rows: list[dict[str, object]] = []
    farm = start_site()
    with started(farm):
        for n in sizes:
            for arm in args.arms.split(","):
                with tempfile.TemporaryDirectory(prefix="etiquette-many-") as tmp:
                    r = run_arm(arm, Path(tmp), farm, n, args.requests, args.connections, args.set)
                rows.append(r)
                print(f"  {arm} {n:>7} sites: {r['requests']} requests in {r['seconds']} s "
                      f"({r['rps']} req/s), proxy CPU {r['cpu_ms_per_request']} ms/req, RSS "
                      f"{r['rss0_mb']} -> {r['rss_mb']} MB (peak {r['hwm_mb']}), answers {r['statuses']}"
                      + (f"\n            audit: {r['audit']}" if "audit" in r else ""))
                sys.stdout.flush()
    for arm in args.arms.split(","):
        mine = [r for r in rows if r["arm"] == arm]
        if len(mine) > 1:
            a, z = mine[0], mine[-1]
            slope = (float(z["rss_mb"]) - float(a["rss_mb"])) * 1024 * 1024 / (int(z["sites"]) - int(a["sites"]))  # type: ignore[arg-type]
            print(f"  {arm}: resident bytes per site, {a['sites']} -> {z['sites']} sites: {slope:,.0f}")
    by = {(r["arm"], r["sites"]): r for r in rows}
    for n in sizes:
        b, c = by.get(("b", n)), by.get(("c", n))
        if b and c:
            print(f"  {n:>7} sites: c/b throughput {float(c['rps']) / float(b['rps']):.3f}, CPU added per "  # type: ignore[arg-type]
                  f"request {float(c['cpu_ms_per_request']) - float(b['cpu_ms_per_request']):+.3f} ms")  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
