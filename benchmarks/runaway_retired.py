"""Seed 003's runaway crawler, directly and through etiquette-proxy (SPEC §7, issue 5).

A retired local site answers every URL — robots.txt included — with the article's 410
(415-byte body, ~1,949 bytes of headers, ~1,700 of them CSP). A naive link-following client
requests ever-new URLs (`/item?ref=N`) as fast as it can for a fixed time: once directly,
once through the proxy at `pacing.rate: 50` (so that pacing alone does not explain the
result). Prints requests and bytes that reached the site both ways, and what the proxy
logged about the trap parameter and the retired site.

    python benchmarks/runaway_retired.py [--seconds 60] [--workers 4]
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import requests  # noqa: E402

from tests.e2e.proxy import Proxy  # noqa: E402
from tests.e2e.sites import Answer, Site  # noqa: E402
from tests.e2e.test_runaway import ARTICLE_410_HEADERS, BODY_410  # noqa: E402

MAX_REQUESTS = 500_000  # a bound on the loop whatever the machine's speed


def answer_bytes() -> int:
    """Bytes the site sends per 410: status line, headers (with Date, Content-Length), body."""
    headers = {"Date": "Mon, 30 Nov 2026 00:00:00 GMT", **ARTICLE_410_HEADERS, "Content-Length": str(len(BODY_410))}
    return len("HTTP/1.1 410 Gone\r\n") + sum(len(k) + len(v) + 4 for k, v in headers.items()) + 2 + len(BODY_410)


def naive_crawl(make_session, base: str, seconds: float, workers: int) -> tuple[int, int, dict[int, int]]:
    """Follow ever-new links without slowing down, `workers` at once (a naive crawler's pool);
    returns (requests, bytes received, statuses)."""
    deadline = time.monotonic() + seconds
    lock = threading.Lock()
    counter = itertools.count()
    totals = {"n": 0, "received": 0}
    statuses: dict[int, int] = {}

    def work() -> None:
        session = make_session()
        while time.monotonic() < deadline:
            n = next(counter)
            if n >= MAX_REQUESTS:
                return
            try:
                r = session.get(f"{base}/item?ref={n}", timeout=max(1.0, deadline - time.monotonic() + 5))
            except requests.RequestException:
                continue
            size = len(r.content) + sum(len(k) + len(v) + 4 for k, v in r.raw.headers.items())
            with lock:
                totals["n"] += 1
                totals["received"] += size
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1

    threads = [threading.Thread(target=work) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 70)
    return totals["n"], totals["received"], statuses


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=4, help="the naive crawler's connections")
    args = parser.parse_args()
    per_answer = answer_bytes()

    site = Site(default=Answer(410, BODY_410, ARTICLE_410_HEADERS))
    def direct_session() -> requests.Session:
        session = requests.Session()
        session.trust_env = False
        return session

    direct_n, direct_rx, _ = naive_crawl(direct_session, site.base, args.seconds, args.workers)
    direct_site = len(site.arrivals)
    site.close()

    site = Site(default=Answer(410, BODY_410, ARTICLE_410_HEADERS))
    state = Path(tempfile.mkdtemp(prefix="etiquette-bench-"))
    proxy = Proxy(state / "state", sets=["pacing.rate=50", "pacing.burst=1"])
    try:
        proxied_n, proxied_rx, statuses = naive_crawl(lambda: proxy.session(ua="naivebot/1.0"), site.base,
                                                      args.seconds, args.workers)
        proxied_site = len(site.arrivals)
        audit = proxy.audit()
    finally:
        proxy.stop()
        site.close()
        shutil.rmtree(state, ignore_errors=True)

    traps = [line["trap"] for line in audit if "trap" in line]
    retired = [line["retired"] for line in audit if "retired" in line]
    warnings = [line["warning"] for line in audit if "warning" in line]
    trimmed = [line for line in audit if "header_bytes_sent" in line]

    print(f"command: python benchmarks/runaway_retired.py --seconds {args.seconds:g} --workers {args.workers}")
    print(f"{'':28}{'direct':>14}{'through proxy':>16}")
    print(f"{'client requests':28}{direct_n:>14,}{proxied_n:>16,}")
    print(f"{'requests reaching the site':28}{direct_site:>14,}{proxied_site:>16,}")
    print(f"{'bytes the site sent':28}{direct_site * per_answer:>14,}{proxied_site * per_answer:>16,}")
    print(f"{'bytes the client received':28}{direct_rx:>14,}{proxied_rx:>16,}")
    ratio = direct_site / max(proxied_site, 1)
    print(f"fewer requests reached the site through the proxy: {ratio:,.0f}x (target >= 100x)")
    print(f"client saw through the proxy: {dict(sorted(statuses.items()))}")
    if trimmed:
        t = trimmed[-1]
        print(f"refusal headers: {t['header_bytes']} bytes from the site, {t['header_bytes_sent']} to the client")
    print(f"trap named in the log: {traps[0] if traps else 'NO'}")
    print(f"retired: {retired[0] if retired else 'NO'}")
    print(f"robots.txt warning: {warnings[0] if warnings else 'none'}")
    return 0 if ratio >= 100 and traps else 1


if __name__ == "__main__":
    sys.exit(main())
