"""Issue 11's campaign: the proxy's promises at the edges, against the real process.

    python benchmarks/campaign.py [--only kill9,slowloris,stall,fuzz] [--kills 12] [--seed 11]

Four phases, each bounded in count and time, loopback only, every process stopped by its PID:

- kill9: load (4 clients, allowed and disallowed paths, a stored page, a site that answered
  429 + Retry-After: 3600) and `kill -9` the proxy, --kills times, restarting on the same state
  dir. Counts: audit lines, broken lines that are not the last, decisions lost (requests the
  site's own log shows with no audit line), disallowed paths at the site, requests that reached
  the paused site after a restart, stored validators sent after a restart.
- slowloris: the proxy under `ulimit -n 1024` (soft = hard), 1,100 half-open connections (a
  request head that never ends), then 40 normal requests; counts served, seconds to serve,
  stderr lines and tracebacks.
- stall: a site that never answers (read timeout 2 s, 2 slots) and one that resets: answers
  by status and decision, audit lines, and whether a normal request still gets through.
- fuzz: raw request lines and headers over sockets, robots.txt bodies with junk around a
  `Disallow: /private/` group (robots.ttl tiny, so every request refetches), and 429s with
  junk Retry-After values. Asserts the proxy never dies and no /private/ path reaches the site
  (judged by the site's own log, paths percent-decoded and dot-segments resolved).

Prints counts per phase and a final verdict; exit 1 if a promise broke.
"""

from __future__ import annotations

import argparse
import json
import os
import posixpath
import random
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._harness import clean_env, etiquette_command, header  # noqa: E402
from tests.e2e.sites import Answer, Site  # noqa: E402

PRIVATE = "/private/"
ROBOTS = b"User-agent: *\nDisallow: /private/\n"
FAST = ["pacing.rate=1000", "pacing.burst=100", "pacing.max_concurrency=16"]


class Proc:
    """The real proxy process; stopped (or killed) by its PID only."""

    def __init__(self, state: Path, sets: list[str], nofile: int | None = None):
        self.state = state
        state.mkdir(parents=True, exist_ok=True)
        self.stderr_path = state.parent / f"{state.name}.stderr"
        err = open(self.stderr_path, "ab")

        def limit() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.proc = subprocess.Popen(etiquette_command(state, sets), stdout=subprocess.PIPE, stderr=err,
                                     text=True, env=clean_env(), preexec_fn=limit)
        err.close()
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("etiquette-proxy listening on "):
            self.proc.kill()
            self.proc.wait(5)
            raise RuntimeError(f"proxy did not start: {line!r}\n{self.stderr()[-2000:]}")
        self.url = line.strip().rsplit(" ", 1)[-1]
        self.port = int(self.url.rsplit(":", 1)[-1])

    @property
    def audit_path(self) -> Path:
        return self.state / "audit.jsonl"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill9(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        if self.proc.stdout:
            self.proc.stdout.close()
        return self.proc.returncode

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""


def quiet(site: Site) -> Site:
    """No socketserver tracebacks when the proxy is killed mid-request (expected here)."""
    site.server.handle_error = lambda *_: None  # type: ignore[method-assign]
    return site


def get(proxy_url: str, url: str, timeout: float = 10.0, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """One request through the proxy on its own connection: (status, decision) or (0, error)."""
    import requests

    try:
        with requests.Session() as s:
            s.trust_env = False
            r = s.get(url, proxies={"http": proxy_url}, timeout=timeout,
                      headers={"User-Agent": "campaignbot/1.0", **(headers or {})})
            return r.status_code, r.headers.get("X-Etiquette-Decision", "")
    except Exception as e:  # noqa: BLE001 - counted, not raised
        return 0, type(e).__name__


def resolved(path: str) -> str:
    """The path a site that decodes and resolves would serve (http.server does both)."""
    p = unquote(path.split("?", 1)[0])
    norm = posixpath.normpath(p) if p else "/"
    return norm + ("/" if p.endswith("/") and not norm.endswith("/") else "")


def private_hits(site: Site) -> list[str]:
    return [a.path for a in site.arrivals if resolved(a.path).startswith(PRIVATE)
            or resolved(a.path).rstrip("/") == PRIVATE.rstrip("/")]


def audit_lines(path: Path) -> tuple[list[dict[str, Any]], int, bool]:
    """(parsed lines, broken lines that are not the last, last line broken)."""
    if not path.exists():
        return [], 0, False
    raw = path.read_bytes().split(b"\n")
    if raw and raw[-1] == b"":
        raw = raw[:-1]
    parsed, broken_inside, last_broken = [], 0, False
    for i, line in enumerate(raw):
        try:
            parsed.append(json.loads(line))
        except ValueError:
            if i == len(raw) - 1:
                last_broken = True
            else:
                broken_inside += 1
    return parsed, broken_inside, last_broken


# -- kill -9 under load --------------------------------------------------------------------------

def phase_kill9(work: Path, kills: int, rng: random.Random) -> dict[str, Any]:
    site = quiet(Site())
    site.route("/robots.txt", Answer(200, ROBOTS))
    site.route("/stored", Answer(200, b"<html>stored</html>", {"ETag": '"s1"', "Cache-Control": "max-age=0"}))
    paused = quiet(Site())
    paused.route("/robots.txt", Answer(404))
    paused.default = Answer(429, b"slow down\n", {"Retry-After": "3600"})
    state = work / "kill9"
    counter = iter(range(10**9))
    lock = threading.Lock()
    sent_private = 0
    rounds = []
    try:
        for round_no in range(kills):
            proxy = Proc(state, FAST)
            if round_no == 0:
                get(proxy.url, site.url("/stored"))
                get(proxy.url, paused.url("/first"))  # 429 + Retry-After: 3600: a pause
            paused_before = len([a for a in paused.arrivals if a.path != "/robots.txt"])
            paused_answer = get(proxy.url, paused.url(f"/after-restart-{round_no}"))
            stored_answer = get(proxy.url, site.url("/stored"))
            stop = threading.Event()

            def load(proxy: Proc = proxy, stop: threading.Event = stop) -> None:
                nonlocal sent_private
                while not stop.is_set():
                    with lock:
                        n = next(counter)
                    private = n % 4 == 0
                    if private:
                        with lock:
                            sent_private += 1
                    status, _ = get(proxy.url, site.url(f"{PRIVATE}{n}" if private else f"/page/{n}"), timeout=3)
                    if status == 0 and not proxy.alive():
                        return

            threads = [threading.Thread(target=load) for _ in range(4)]
            for t in threads:
                t.start()
            time.sleep(rng.uniform(0.6, 1.6))
            proxy.kill9()
            stop.set()
            for t in threads:
                t.join(15)
            rounds.append({"paused_reached_site": len([a for a in paused.arrivals if a.path != "/robots.txt"])
                           - paused_before, "paused_answer": paused_answer, "stored_answer": stored_answer})
        final = Proc(state, FAST)  # state reopens after the last kill
        reopened = get(final.url, site.url("/after-all"))
        final.stop()
        lines, broken_inside, last_broken = audit_lines(state / "audit.jsonl")
        logged = {line["url"] for line in lines}
        arrivals = [a.path for a in site.arrivals if a.path.startswith("/page/")]
        lost = [p for p in arrivals if site.url(p) not in logged]
        revalidated = [a for a in site.arrivals if a.path == "/stored" and "if-none-match" in a.headers]
        return {
            "kills": kills,
            "audit lines": len(lines),
            "broken lines not last": broken_inside,
            "torn last line": last_broken,
            "requests at the site": len(arrivals),
            "decisions lost (at the site, no audit line)": len(lost),
            "disallowed requests sent / reaching the site": f"{sent_private} / {len(private_hits(site))}",
            "paused site reached after a restart": sum(r["paused_reached_site"] for r in rounds),
            "paused site answers after restarts": sorted({f"{s} {d}" for r in rounds
                                                         for s, d in [r["paused_answer"]]}),
            "stored page revalidated after restarts (If-None-Match at the site)": len(revalidated),
            "state reopened after the last kill": reopened,
            "ok": broken_inside == 0 and not private_hits(site) and all(
                r["paused_reached_site"] == 0 for r in rounds) and reopened[0] == 200,
        }
    finally:
        site.close()
        paused.close()


# -- slowloris at ulimit -n 1024 ---------------------------------------------------------------

def proxy_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def phase_slowloris(work: Path, half_open: int, normal: int, header_timeout: str,
                    normal_timeout: float = 60.0) -> dict[str, Any]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    site = quiet(Site())
    site.route("/robots.txt", Answer(404))
    proxy = Proc(work / f"slowloris-{header_timeout}", [*FAST, f"listen.header_timeout={header_timeout}"],
                 nofile=1024)
    socks: list[socket.socket] = []
    try:
        for _ in range(half_open):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", proxy.port))
            socks.append(s)
        deadline = time.monotonic() + 10
        sent = 0
        pending = list(socks)
        while pending and time.monotonic() < deadline:  # a head that never ends, once connected
            left = []
            for s in pending:
                try:
                    s.send(b"GET " + site.url("/slowloris").encode() + b" HTTP/1.1\r\nHost: x\r\n")
                    sent += 1
                except (BlockingIOError, OSError):
                    left.append(s)
            pending = left
            time.sleep(0.1)
        peak_fds = proxy_fds(proxy.proc.pid)
        t0 = time.monotonic()
        results: list[tuple[int, str]] = []
        res_lock = threading.Lock()

        def one(i: int) -> None:
            r = get(proxy.url, site.url(f"/normal/{i}"), timeout=normal_timeout)
            with res_lock:
                results.append(r)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(normal)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(normal_timeout + 30)
        served_s = time.monotonic() - t0
        closed = 0
        for s in socks:
            try:
                s.setblocking(True)
                s.settimeout(0.01)
                if s.recv(1) == b"":
                    closed += 1
            except (TimeoutError, BlockingIOError):
                pass
            except OSError:
                closed += 1
        served = sum(1 for s, _ in results if s == 200)
        err = proxy.stderr()
        if os.environ.get("CAMPAIGN_SHOW_STDERR"):
            print(err)
        return {
            "fd limit (soft = hard)": 1024,
            "half-open connections (head sent / opened)": f"{sent} / {len(socks)}",
            "proxy descriptors open under the attack": peak_fds,
            "normal requests served 200": f"{served} of {normal}",
            "other answers": sorted({f"{s} {d}" for s, d in results if s != 200}),
            "seconds until all normal requests answered": round(served_s, 1),
            "half-open connections closed by the proxy by then": closed,
            "normal requests at the site": len([a for a in site.arrivals if a.path.startswith("/normal/")]),
            "slowloris requests at the site": len([a for a in site.arrivals if a.path == "/slowloris"]),
            "proxy alive": proxy.alive(),
            "stderr lines / bytes": f"{len(err.splitlines())} / {len(err.encode())}",
            "tracebacks": err.count("Traceback"),
            "descriptor-exhaustion lines": err.count("out of file descriptors"),
            "ok": served == normal and proxy.alive() and err.count("Traceback") == 0,
        }
    finally:
        for s in socks:
            s.close()
        proxy.stop()
        site.close()


# -- stalled and resetting sites ---------------------------------------------------------------

def phase_stall(work: Path, n: int) -> dict[str, Any]:
    stall = quiet(Site())
    stall.route("/robots.txt", Answer(404))
    stall.default = Answer(200, b"late", stall_s=30)
    stall.route("/fine", Answer(200, b"fine"))
    reset = quiet(Site())
    reset.route("/robots.txt", Answer(404))
    reset.default = Answer(reset=True)
    proxy = Proc(work / "stall", ["pacing.rate=100", "pacing.burst=20", "pacing.max_concurrency=2",
                                  "upstream.read_timeout=2s", "pacing.max_hold=5m"])
    try:
        answers: list[tuple[int, str]] = []
        lock = threading.Lock()

        def one(site: Site, path: str) -> None:
            r = get(proxy.url, site.url(path), timeout=60)
            with lock:
                answers.append(r)

        t0 = time.monotonic()
        threads = [threading.Thread(target=one, args=(stall, f"/stall/{i}")) for i in range(n)]
        threads += [threading.Thread(target=one, args=(reset, f"/reset/{i}")) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        took = time.monotonic() - t0
        fine = get(proxy.url, stall.url("/fine"))
        lines, _, _ = audit_lines(proxy.audit_path)
        by: dict[str, int] = {}
        for a in answers:
            by[f"{a[0]} {a[1]}"] = by.get(f"{a[0]} {a[1]}", 0) + 1
        page_lines = [ln for ln in lines if "/stall/" in ln["url"] or "/reset/" in ln["url"]]
        return {
            "requests (stalled + reset)": f"{n} + {n}",
            "answers by status and decision": by,
            "seconds for all of them (2 slots, read_timeout 2 s)": round(took, 1),
            "audit lines for them": len(page_lines),
            "stalled requests at the site": len([a for a in stall.arrivals if a.path.startswith("/stall/")]),
            "a normal request to the stalled site afterwards": fine,
            "ok": by.get("504 failed", 0) == n and by.get("502 failed", 0) == n and len(page_lines) == 2 * n
            and fine[0] == 200,
        }
    finally:
        proxy.stop()
        stall.close()
        reset.close()


# -- fuzz ----------------------------------------------------------------------------------------

METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "get", "GE T", "CONNECT", "\x00GET", "G" * 300]
JUNK = ["\x00", "\r", "\x7f", "\ufeff", "é", "\u202e", "%00", "%ff", "\\", "..", "//", ";", "#", "?", " ", "\t"]


def junk(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(JUNK + [chr(rng.randrange(32, 127))]) for _ in range(n))


SAFE = "abcdefghijklmnopqrstuvwxyz0123456789-._~%/"


def safe(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(SAFE) for _ in range(n))


def fuzz_request(rng: random.Random, port: int) -> bytes:
    """Half well-formed requests with fuzzed paths and headers, half garbage."""
    well_formed = rng.random() < 0.5
    method = rng.choice(["GET", "HEAD"]) if well_formed else rng.choice(METHODS)
    where = rng.random()
    if where < 0.5:
        path = f"{PRIVATE}{safe(rng, rng.randrange(0, 20))}"
    elif where < 0.9:
        path = f"/ok/{safe(rng, rng.randrange(0, 30))}"
    else:
        path = "/" + "a" * rng.randrange(0, 70000)
    if rng.random() < 0.3:
        path += "?" + safe(rng, rng.randrange(0, 30)).replace("/", "=")
    target = f"http://127.0.0.1:{port}{path}"
    if not well_formed and rng.random() < 0.5:
        target = target[:rng.randrange(0, len(target) + 1)] + junk(rng, rng.randrange(0, 20))
    version = "HTTP/1.1" if well_formed else rng.choice(["HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/9", "",
                                                         "HTTP/1.1 extra"])
    headers = [f"Host: 127.0.0.1:{port}"] if well_formed or rng.random() < 0.8 else []
    for _ in range(rng.randrange(0, 8)):
        name = rng.choice(["X-A", "Content-Length", "Transfer-Encoding", "Connection", "If-None-Match",
                           "User-Agent", "Accept", "Cookie", "Expect"] + ([] if well_formed else
                                                                         [junk(rng, 5), "Host"]))
        value = rng.choice(["-1", "chunked", "999999999999", "close", junk(rng, rng.randrange(0, 40)),
                            "x" * rng.randrange(0, 9000), "a\r\nInjected: yes", "100-continue", "0"])
        if well_formed and name in ("Content-Length", "Transfer-Encoding", "Expect"):
            value = "0" if name == "Content-Length" else "identity" if name == "Transfer-Encoding" else "nothing"
        headers.append(f"{name}: {value}")
    head = f"{method} {target} {version}\r\n" + "\r\n".join(headers) + "\r\n\r\n"
    body = junk(rng, rng.randrange(0, 50)) if not well_formed and rng.random() < 0.3 else ""
    return head.encode("utf-8", "surrogatepass") + body.encode("utf-8", "surrogatepass")


def send_raw(port: int, data: bytes) -> str:
    """Send one raw request; the status the proxy answered, or what happened instead."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
            s.sendall(data)
            first = s.recv(64).split(b"\r\n", 1)[0]
    except OSError as e:
        return type(e).__name__
    key = first.decode("latin-1")
    return key.split(" ")[1] if key.startswith("HTTP/") and " " in key else (key[:12] or "(closed)")


def fuzz_robots(rng: random.Random) -> bytes:
    """Junk before and after a `User-agent: *` / `Disallow: /private/` group that must hold."""
    before = [rng.choice([f"# {junk(rng, 20)}", junk(rng, rng.randrange(0, 40)).replace(":", ""),
                          "Sitemap: http://x/s.xml", "\x00\x00", "   ", "\ufeff"]) for _ in range(rng.randrange(0, 5))]
    after = [rng.choice([f"User-agent: {junk(rng, 6).replace(chr(10), '')}", "Disallow:", "Allow: /",
                         f"Crawl-delay: {rng.choice(['-1', 'NaN', '1e308', junk(rng, 4)])}",
                         junk(rng, rng.randrange(0, 200)), "Disallow: /" + junk(rng, 10)])
             for _ in range(rng.randrange(0, 8))]
    text = "\n".join(b.replace("\n", "") for b in before)
    text += "\nUser-agent: *\nDisallow: /private/\n\n" + "\n".join(a.replace("\n", "") for a in after)
    data = text.encode("utf-8", "surrogatepass")
    if rng.random() < 0.2:
        data += bytes(rng.randrange(256) for _ in range(rng.randrange(0, 300)))  # binary tail
    return data


RETRY_AFTER = ["0", "-1", "1e309", "NaN", "99999999999999999999", "Wed, 21 Oct 2015 07:28:00 GMT",
               "Fri, 31 Dec 9999 23:59:59 GMT", "", " ", "2, 3", "1.5", "\x00", "é", "3600", "abc"]


def phase_fuzz(work: Path, requests: int, robots_bodies: int, retry_afters: int, rng: random.Random) -> dict[str, Any]:
    site = quiet(Site())
    body_of: dict[str, bytes] = {"current": ROBOTS}
    site.route("/robots.txt", lambda _a: Answer(200, body_of["current"]))
    # Crawl-delay is fuzzed too; capped at 1 ms so each body is judged at once, not paced.
    proxy = Proc(work / "fuzz", [*FAST, "robots.ttl=1ms", "robots.max_crawl_delay=1ms", "upstream.read_timeout=5s"])
    statuses: dict[str, int] = {}
    sent_private = 0
    try:
        from concurrent.futures import ThreadPoolExecutor

        t0 = time.monotonic()
        batch = [fuzz_request(rng, site.port) for _ in range(requests)]
        sent_private = sum(PRIVATE.encode() in data.split(b"\r\n", 1)[0] for data in batch)
        with ThreadPoolExecutor(16) as pool:
            for code in pool.map(lambda d: send_raw(proxy.port, d), batch):
                statuses[code] = statuses.get(code, 0) + 1
        raw_s = time.monotonic() - t0
        t0 = time.monotonic()
        for i in range(robots_bodies):
            body_of["current"] = fuzz_robots(rng)
            get(proxy.url, site.url(f"{PRIVATE}r{i}"))
            get(proxy.url, site.url(f"/ok/r{i}"))
        robots_s = time.monotonic() - t0
        t0 = time.monotonic()
        ra_sites = []
        ra_answers: dict[str, int] = {}
        for value in (RETRY_AFTER * (retry_afters // len(RETRY_AFTER) + 1))[:retry_afters]:
            s429 = quiet(Site())
            s429.route("/robots.txt", Answer(404))
            s429.default = Answer(429, b"slow down\n", {"Retry-After": value})
            ra_sites.append(s429)
            first_status, _ = get(proxy.url, s429.url("/a"))
            second = get(proxy.url, s429.url("/b"))
            ra_answers[f"{first_status} then {second[0]} {second[1]}"] = ra_answers.get(
                f"{first_status} then {second[0]} {second[1]}", 0) + 1
        for s in ra_sites:
            s.close()
        ra_s = time.monotonic() - t0
        alive_after = proxy.alive() and get(proxy.url, site.url("/ok/final"))[0] == 200
        err = proxy.stderr()
        hits = private_hits(site)
        return {
            "raw requests sent (with /private/ in the request line)": f"{requests} ({sent_private})",
            "answers to raw requests (status or what happened)": dict(sorted(statuses.items())),
            "robots.txt bodies fuzzed": robots_bodies,
            "Retry-After values (first answer then next)": ra_answers,
            "seconds (raw, robots, Retry-After)": f"{raw_s:.0f}, {robots_s:.0f}, {ra_s:.0f}",
            "/private/ paths at the site": len(hits),
            "proxy alive and serving afterwards": alive_after,
            "tracebacks in stderr": err.count("Traceback"),
            "ok": not hits and alive_after,
        }
    finally:
        proxy.stop()
        site.close()


COMPARISONS = {"slowloris-no-timeout"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--only", default="kill9,slowloris,slowloris-no-timeout,stall,fuzz")
    ap.add_argument("--kills", type=int, default=12)
    ap.add_argument("--half-open", type=int, default=1100)
    ap.add_argument("--normal", type=int, default=40)
    ap.add_argument("--header-timeout", default="5s")
    ap.add_argument("--stalls", type=int, default=10)
    ap.add_argument("--fuzz-requests", type=int, default=2000)
    ap.add_argument("--fuzz-robots", type=int, default=200)
    ap.add_argument("--fuzz-retry-after", type=int, default=15)
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args()
    # SIGTERM unwinds like Ctrl-C: every `finally` stops the processes this script started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    header("issue 11 campaign: kill -9, slowloris, stalled/resetting sites, fuzz")
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="etiquette-campaign-"))
    verdicts = {}
    try:
        phases = {
            "kill9": lambda: phase_kill9(work, args.kills, rng),
            "slowloris": lambda: phase_slowloris(work, args.half_open, args.normal, args.header_timeout),
            # The same attack with the header timeout out of the way (1 h): what it buys.
            "slowloris-no-timeout": lambda: phase_slowloris(work, args.half_open, args.normal, "1h", 20.0),
            "stall": lambda: phase_stall(work, args.stalls),
            "fuzz": lambda: phase_fuzz(work, args.fuzz_requests, args.fuzz_robots, args.fuzz_retry_after, rng),
        }
        for name in args.only.split(","):
            t0 = time.monotonic()
            result = phases[name]()
            ok = result.pop("ok")
            if name in COMPARISONS:
                print(f"\n-- {name} ({time.monotonic() - t0:.0f} s): comparison, not a promise")
            else:
                verdicts[name] = ok
                print(f"\n-- {name} ({time.monotonic() - t0:.0f} s): {'ok' if ok else 'BROKEN'}")
            for k, v in result.items():
                print(f"  {k}: {v}")
            sys.stdout.flush()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\nverdict:", ", ".join(f"{k} {'ok' if v else 'BROKEN'}" for k, v in verdicts.items()))
    return 0 if all(verdicts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
