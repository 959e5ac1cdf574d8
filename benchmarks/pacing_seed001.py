"""Seed 001's 429 scenario, directly and through etiquette-proxy (SPEC §5, issue 3).

The article's local site answers 429 + `Retry-After: 2` to any client faster than 2 requests/s;
here: more than 2 requests within the last 1 s (a window closed at both ends; every request
counts, refused ones and robots.txt included). 40 tries each:

- naive, direct: a loop at 5/s that, on a 429, waits Retry-After and resumes its old pace
  (the article: 13 x 429, 0.94 pages/s);
- through the proxy at `pacing.rate=5` (burst 1, the defaults otherwise): a client sending
  each request as soon as the previous answer is back (the article's polite loop: 3 x 429,
  1.11 pages/s; target here: at most 1 x 429 (the limit is learned from it, SPEC §5), at least
  1.8 pages/s, 0 arrivals in a pause);
- the same through the proxy, the site also sending RateLimit / RateLimit-Policy fields
  (target: 0 x 429).

Prints 429s, pages/s (pages fetched / time from the first try to the last answer), the rate
trajectory from the audit log, and arrivals at the site inside a pause it asked for.

    python benchmarks/pacing_seed001.py [--tries 40]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import requests  # noqa: E402

from benchmarks._harness import header  # noqa: E402
from tests.e2e.proxy import Proxy  # noqa: E402
from tests.e2e.sites import Site, WindowedLimit  # noqa: E402


def summary(label: str, codes: list[int], elapsed: float, site: Site, limit: WindowedLimit,
            rates: list[float] | None) -> dict[str, float]:
    pages = codes.count(200)
    throttled = codes.count(429)
    trace = "".join("." if c == 200 else "T" if c == 429 else "x" for c in codes)
    in_pause = limit.in_pause(site.arrivals)
    print(f"{label}")
    print(f"  trace:     {trace}")
    print(f"  {throttled} x 429 in {len(codes)} tries, {elapsed:.1f}s, {pages / elapsed:.2f} pages/s; "
          f"{len(in_pause)} arrivals inside a pause the site asked for; "
          f"{len(site.arrivals)} requests reached the site")
    if rates is not None:
        shown = [rates[i] for i in range(0, len(rates), max(1, len(rates) // 10))][:10]
        print(f"  rate trajectory (audit `rate`, every {max(1, len(rates) // 10)}th line): "
              f"{[round(r, 2) for r in shown]}; last {rates[-1]:.2f}")
    return {"throttled": throttled, "pages_per_s": pages / elapsed, "in_pause": len(in_pause)}


def naive(tries: int, pace: float) -> dict[str, float]:
    site = Site()
    limit = WindowedLimit(site, retry_after="2")
    try:
        s = requests.Session()
        s.trust_env = False
        codes: list[int] = []
        t0 = time.monotonic()
        next_at = t0
        for i in range(tries):
            time.sleep(max(0.0, next_at - time.monotonic()))
            r = s.get(site.url(f"/catalog/{i}"), timeout=30)
            codes.append(r.status_code)
            next_at = time.monotonic() + 1.0 / pace
            if r.status_code == 429:
                next_at = time.monotonic() + float(r.headers.get("Retry-After", "1"))
        elapsed = time.monotonic() - t0
        return summary(f"naive loop, direct ({pace:g}/s, waits Retry-After, then its old pace)",
                       codes, elapsed, site, limit, None)
    finally:
        site.close()


def through_proxy(tries: int, rate: float, fields: bool, work: Path) -> dict[str, float]:
    site = Site()
    limit = WindowedLimit(site, retry_after="2", fields=fields)
    proxy = Proxy(work / ("fields" if fields else "plain"), sets=[f"pacing.rate={rate:g}"])
    try:
        s = proxy.session()
        codes: list[int] = []
        t0 = time.monotonic()
        for i in range(tries):
            codes.append(s.get(site.url(f"/catalog/{i}"), timeout=120).status_code)
        elapsed = time.monotonic() - t0
        s.close()
        lines = [r for r in proxy.audit() if not r.get("robots_fetch")]
        label = (f"through etiquette-proxy (pacing.rate={rate:g}), "
                 f"{'site sends RateLimit fields' if fields else 'no RateLimit fields'}")
        result = summary(label, codes, elapsed, site, limit, [r["rate"] for r in lines])
        for r in lines:
            if r["outcome"] == "throttled":
                print(f"    throttled: {r['url'].rsplit('/', 1)[-1]:>3} retry_after={r.get('retry_after')} "
                      f"pause_s={r.get('pause_s')} rate={r['rate']} ceiling={r.get('ceiling')}")
        return result
    finally:
        proxy.stop()
        site.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tries", type=int, default=40)
    parser.add_argument("--rate", type=float, default=5.0)
    args = parser.parse_args()
    header("seed 001: 429 + Retry-After: 2 above 2 requests/s, 40 tries")
    work = Path(tempfile.mkdtemp(prefix="pacing-seed001-"))
    try:
        n = naive(args.tries, args.rate)
        p = through_proxy(args.tries, args.rate, False, work)
        f = through_proxy(args.tries, args.rate, True, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("article: polite loop 3 x 429 at 1.11 pages/s; naive loop 13 x 429 at 0.94 pages/s")
    ok = p["throttled"] <= 1 and p["pages_per_s"] >= 1.8 and p["in_pause"] == 0 and f["throttled"] == 0
    print(f"targets (proxy <= 1 x 429, >= 1.8 pages/s, 0 in pause; with fields 0 x 429): "
          f"{'met' if ok else 'MISSED'}; naive {n['throttled']:.0f} x 429 at {n['pages_per_s']:.2f} pages/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
