"""Scrapy direct vs Scrapy through `etiquette-proxy wrap` on one site that pushes back (issue 35).

The site (in this process, loopback): `--pages` pages linked from `/` (each page also links to
a page under `/private/`), robots.txt `Disallow: /private/`, an ETag on every page (304 to a
matching `If-None-Match`), and 429 + `Retry-After: 1` to any request beyond `--limit` served in
the last second (a sliding window, as seed 001's site). Its own log is the judge.

Arms, each a real `scrapy runspider` process that follows every link from `/`:
  direct    ROBOTSTXT_OBEY and AutoThrottle on (what a careful Scrapy user sets), defaults otherwise
  proxy     through `etiquette-proxy wrap` (own state dir), ROBOTSTXT_OBEY and AutoThrottle off
            (the proxy does both), DOWNLOAD_TIMEOUT above pacing.max_hold
  recrawl   the same again with `wrap --keep-state` on the proxy arm's state dir: validators
            stored by the first pass make unchanged pages cost a 304

Printed per arm: pages Scrapy got (200s), 429s the site sent, requests to /private/ that reached
it, body bytes it sent, 304s, wall time. Scrapy runs from its own venv (made on first use under
~/.cache/etiquette-proxy/scrapy-venv with `pip install scrapy`), never the project's.

    python benchmarks/scrapy_compare.py [--pages 300] [--limit 2] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ETIQUETTE = str(Path(sys.executable).with_name("etiquette-proxy"))
SCRAPY_VENV = Path.home() / ".cache" / "etiquette-proxy" / "scrapy-venv"

SPIDER = r'''
import re, scrapy

class Everything(scrapy.Spider):
    name = "everything"

    def __init__(self, start=None, **kw):
        super().__init__(**kw)
        self.start_urls = [start]

    def parse(self, response):
        yield {"url": response.url, "status": response.status}
        for href in re.findall(rb'href="([^"]+)"', response.body):
            yield response.follow(href.decode(), self.parse)
'''


class PushyLog:
    def __init__(self, limit: int):
        self.limit = limit
        self.lock = threading.Lock()
        self.served: deque[float] = deque()
        self.rows: list[dict] = []


def make_site(pages: int, log: PushyLog) -> ThreadingHTTPServer:
    def page(n: int) -> bytes:
        links = "".join(f'<a href="/p/{m}">p{m}</a> ' for m in (n * 3 + 1, n * 3 + 2, n * 3 + 3) if m < pages)
        return f'<html><body><h1>page {n}</h1>{links}<a href="/private/{n}">private</a></body></html>'.encode()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            now = time.monotonic()
            path = self.path.split("?", 1)[0]
            with log.lock:
                while log.served and now - log.served[0] > 1.0:
                    log.served.popleft()
                over = len(log.served) >= log.limit and path != "/robots.txt"
                if not over:
                    log.served.append(now)
            if over:
                self._send(429, b"too many requests\n", {"Retry-After": "1"}, path, now)
                return
            if path == "/robots.txt":
                self._send(200, b"User-agent: *\nDisallow: /private/\n", {}, path, now)
                return
            m = re.fullmatch(r"/(?:p/(\d+))?", path)
            n = int(m.group(1) or 0) if m else -1
            if path.startswith("/private/") or 0 <= n < pages:
                body = b"private\n" if path.startswith("/private/") else page(n)
                etag = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
                if self.headers.get("If-None-Match") == etag:
                    self._send(304, b"", {"ETag": etag}, path, now)
                else:
                    self._send(200, body, {"ETag": etag, "Content-Type": "text/html"}, path, now)
                return
            self._send(404, b"no\n", {}, path, now)

        def _send(self, status: int, body: bytes, headers: dict[str, str], path: str, at: float) -> None:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if status != 304:
                self.wfile.write(body)
            with log.lock:
                log.rows.append({"path": path, "status": status, "bytes": len(body) if status != 304 else 0, "at": at})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def scrapy_python() -> str:
    python = SCRAPY_VENV / "bin" / "python"
    if not python.exists():
        print(f"making {SCRAPY_VENV} (pip install scrapy) ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(SCRAPY_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "scrapy"], check=True)
    return str(python)


def run_arm(name: str, cmd: list[str], site: ThreadingHTTPServer, log: PushyLog, timeout: float) -> dict:
    with log.lock:
        log.rows.clear()
        log.served.clear()
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                          env={k: v for k, v in os.environ.items() if "proxy" not in k.lower()})
    wall = time.monotonic() - started
    items = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    with log.lock:
        rows = list(log.rows)
    gave_up = len(re.findall(r"Gave up retrying", done.stderr))
    return {"arm": name, "exit": done.returncode, "pages_200": sum(1 for i in items if i["status"] == 200),
            "site_429": sum(1 for r in rows if r["status"] == 429),
            "site_private": sum(1 for r in rows if r["path"].startswith("/private/")),
            "site_304": sum(1 for r in rows if r["status"] == 304),
            "site_body_bytes": sum(r["bytes"] for r in rows if r["status"] == 200 and r["path"] != "/robots.txt"),
            "site_requests": len(rows), "retries_given_up": gave_up, "wall_s": round(wall, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=300)
    ap.add_argument("--limit", type=int, default=2, help="requests the site serves per sliding second")
    ap.add_argument("--set", action="append", default=[], help="etiquette-proxy config override for the proxy arms")
    ap.add_argument("--timeout", type=float, default=1200, help="per arm, seconds")
    args = ap.parse_args()
    python = scrapy_python()
    log = PushyLog(args.limit)
    site = make_site(args.pages, log)
    start = f"http://127.0.0.1:{site.server_address[1]}/"
    work = Path(tempfile.mkdtemp(prefix="scrapy-compare-"))
    spider = work / "spider.py"
    spider.write_text(SPIDER)
    base = [python, "-m", "scrapy", "runspider", str(spider), "-a", f"start={start}", "-O", "-:jsonlines",
            "-s", "LOG_LEVEL=INFO", "-s", "TELNETCONSOLE_ENABLED=False"]
    direct = base + ["-s", "ROBOTSTXT_OBEY=True", "-s", "AUTOTHROTTLE_ENABLED=True"]
    proxied = base + ["-s", "ROBOTSTXT_OBEY=False", "-s", "AUTOTHROTTLE_ENABLED=False", "-s", "DOWNLOAD_TIMEOUT=120"]
    sets = [f"--set={s}" for s in args.set]
    state = work / "state"
    arms = [
        ("direct", direct),
        ("proxy", [ETIQUETTE, "wrap", "--state-dir", str(state), "--keep-state", "--report=none", *sets, "--",
                   *proxied]),
        ("recrawl", [ETIQUETTE, "wrap", "--state-dir", str(state), "--keep-state", "--report=none", *sets, "--",
                     *proxied]),
    ]
    results = [run_arm(name, cmd, site, log, args.timeout) for name, cmd in arms]
    site.shutdown()
    print(f"site: {args.pages} pages + /private/ links, robots.txt Disallow: /private/, ETags, "
          f"429 + Retry-After: 1 above {args.limit}/s (sliding)")
    cols = ("arm", "pages_200", "site_429", "site_private", "site_304", "site_body_bytes", "site_requests",
            "retries_given_up", "wall_s", "exit")
    print(" ".join(f"{c:>16}" for c in cols))
    for r in results:
        print(" ".join(f"{r[c]!s:>16}" for c in cols))
    print("command:", " ".join([os.path.relpath(sys.argv[0]), *sys.argv[1:]]))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent, check=False).stdout.strip()
    print(f"commit: {commit}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
