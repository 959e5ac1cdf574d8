#!/usr/bin/env python3
"""The article's case: a crawler that knows nothing about ETags, re-crawling a site through the proxy.

Three local sites of N pages each (default 1,000): one sends ETag and Last-Modified, one only
Last-Modified, one neither (its pages print a "generated at" time, so only the fingerprint can
tell change). Pass 1 crawls every page through the proxy; then 2% of the pages change; pass 2
crawls again with a client that sends no conditional headers. Printed per site: the share of
unchanged pages the site answered 304 (target 100%), body bytes the site sent in pass 2 vs
pass 1, pass-2 requests by outcome, `changed` counts from the audit log, and whether every body
the client received equals the site's current page (must be all).

Loopback only, bounded: --pages (<= 5,000) pages per site, --timeout seconds per pass.

    PYTHONPATH=. python benchmarks/revalidation.py [--pages 1000] [--clients 8]
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import email.utils
import hashlib
import random
import shlex
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import requests  # noqa: E402

from tests.e2e.proxy import Proxy  # noqa: E402

KINDS = ("etag+last-modified", "last-modified only", "neither")


class PageSite:
    """N pages; answers If-None-Match / If-Modified-Since like a real server; counts what it sent."""

    def __init__(self, kind: str, pages: int, seed: int):
        self.kind = kind
        rnd = random.Random(seed)
        words = ["crawl", "polite", "proxy", "etag", "page", "site", "robots", "fetch", "store"]
        self.bodies = {f"/p/{i}": " ".join(rnd.choice(words) for _ in range(1200)) for i in range(pages)}
        self.versions = {path: 1 for path in self.bodies}
        self.lock = threading.Lock()
        self.reset_counts()
        site = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                site.handle(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def reset_counts(self) -> None:
        self.sent: dict[str, int] = {}  # path -> last status sent
        self.body_bytes = 0

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def current(self, path: str) -> bytes:
        """The page as the site serves it now (without the volatile time for `neither`)."""
        return f"<html><body><h1>{path} v{self.versions[path]}</h1><p>{self.bodies[path]}</p>".encode()

    def change(self, path: str) -> None:
        self.bodies[path] = self.bodies[path] + " changed"
        self.versions[path] += 1

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        path = h.path
        if path not in self.bodies:
            h.send_response(404)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        body = self.current(path)
        headers: dict[str, str] = {"Content-Type": "text/html"}
        if self.kind == "etag+last-modified":
            headers["ETag"] = '"' + hashlib.sha256(body).hexdigest()[:20] + '"'
        if self.kind != "neither":
            headers["Last-Modified"] = email.utils.formatdate(
                1_700_000_000 + 3600 * self.versions[path], usegmt=True)
        inm, ims = h.headers.get("If-None-Match"), h.headers.get("If-Modified-Since")
        if "ETag" in headers and inm is not None:
            fresh = inm == headers["ETag"]
        elif "Last-Modified" in headers and ims is not None and inm is None:
            fresh = ims == headers["Last-Modified"]
        else:
            fresh = False
        if self.kind == "neither":  # a page that prints when it was generated
            body += f"<footer>generated at {time.strftime('%H:%M:%S')}</footer>".encode()
        body += b"</body></html>"
        status = 304 if fresh else 200
        with self.lock:
            self.sent[path] = status
            if status == 200:
                self.body_bytes += len(body)
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", "0" if status == 304 else str(len(body)))
        h.end_headers()
        if status == 200:
            h.wfile.write(body)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def crawl(proxy: Proxy, site: PageSite, clients: int, timeout: float) -> dict[str, bytes]:
    """GET every page once through the proxy, no conditional headers; the bodies received."""
    local = threading.local()

    def get(path: str) -> tuple[str, bytes]:
        if not hasattr(local, "s"):
            local.s = requests.Session()
            local.s.trust_env = False
            local.s.proxies = proxy.proxies
            local.s.headers["User-Agent"] = "benchbot/1.0"
        r = local.s.get(site.url(path), timeout=30)
        r.raise_for_status()
        return path, r.content

    deadline = time.monotonic() + timeout
    got: dict[str, bytes] = {}
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        for future in concurrent.futures.as_completed(
                [pool.submit(get, p) for p in site.bodies], timeout=timeout):
            path, body = future.result()
            got[path] = body
            if time.monotonic() > deadline:
                raise TimeoutError("pass took longer than --timeout")
    return got


def strip_volatile(body: bytes) -> bytes:
    return body.split(b"<footer>")[0] + b"</body></html>" if b"<footer>" in body else body


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=1000, help="pages per site (<= 5000)")
    ap.add_argument("--change", type=float, default=0.02, help="share of pages changed before pass 2")
    ap.add_argument("--clients", type=int, default=8, help="concurrent client connections")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds allowed per pass")
    ap.add_argument("--seed", type=int, default=4)
    args = ap.parse_args()
    if not 1 <= args.pages <= 5000 or not 0 <= args.change <= 1:
        ap.error("--pages must be 1..5000 and --change 0..1")

    rnd = random.Random(args.seed)
    print("command:", shlex.join(["PYTHONPATH=.", "python", *sys.argv]))
    sites = [PageSite(kind, args.pages, args.seed + n) for n, kind in enumerate(KINDS)]
    sets = []
    for host in ("127.0.0.1",):
        sets += [f'sites."{host}".pacing.rate=1000', f'sites."{host}".pacing.burst=100',
                 f'sites."{host}".pacing.max_concurrency=16']
    with tempfile.TemporaryDirectory(prefix="etiquette-bench-") as tmp:
        proxy = Proxy(Path(tmp) / "state", sets=sets)
        print("proxy:", shlex.join(proxy.cmd))
        ok = True
        try:
            for site in sites:
                ok &= run_site(proxy, site, args, rnd)
        finally:
            proxy.stop()
            for site in sites:
                site.close()
    return 0 if ok else 1


def run_site(proxy: Proxy, site: PageSite, args: argparse.Namespace, rnd: random.Random) -> bool:
    start = time.monotonic()
    crawl(proxy, site, args.clients, args.timeout)
    pass1_s = time.monotonic() - start
    pass1_bytes = site.body_bytes
    audit_mark = len(proxy.audit())

    changed = set(rnd.sample(sorted(site.bodies), round(len(site.bodies) * args.change)))
    for path in changed:
        site.change(path)
    site.reset_counts()
    start = time.monotonic()
    received = crawl(proxy, site, args.clients, args.timeout)
    pass2_s = time.monotonic() - start

    unchanged = [p for p in site.bodies if p not in changed]
    answered_304 = sum(1 for p in unchanged if site.sent.get(p) == 304)
    wrong = [p for p, body in received.items() if strip_volatile(body) != strip_volatile(
        site.current(p) + b"</body></html>")]
    proxy.wait_audit(lambda r: False, timeout=0.3)
    lines = [r for r in proxy.audit()[audit_mark:] if f":{site.port}/" in r["url"] and not r.get("robots_fetch")]
    outcomes = collections.Counter(r["outcome"] for r in lines)
    flagged = collections.Counter(str(r.get("changed")).lower() for r in lines)
    truly_changed = {site.url(p) for p in changed}
    misflagged = sum(1 for r in lines if (r.get("changed") is True) != (r["url"] in truly_changed))

    print(f"\n== site sending {site.kind}: {len(site.bodies)} pages, {len(changed)} changed before pass 2")
    print(f"  pass 1: {pass1_s:6.1f} s, site sent {pass1_bytes:>11,} body bytes")
    print(f"  pass 2: {pass2_s:6.1f} s, site sent {site.body_bytes:>11,} body bytes "
          f"({100 * site.body_bytes / max(pass1_bytes, 1):.1f}% of pass 1)")
    print(f"  unchanged pages the site answered 304: {answered_304}/{len(unchanged)} "
          f"({100 * answered_304 / max(len(unchanged), 1):.1f}%)")
    print(f"  pass 2 requests by outcome: {dict(sorted(outcomes.items()))}")
    print(f"  audit `changed`: {dict(sorted(flagged.items()))}; lines disagreeing with the truth: {misflagged}")
    print(f"  bodies equal to the site's current page: {len(received) - len(wrong)}/{len(site.bodies)}"
          + (f"  MISMATCH e.g. {wrong[:3]}" if wrong else "  (all)"))
    return not wrong and len(received) == len(site.bodies)


if __name__ == "__main__":
    sys.exit(main())
