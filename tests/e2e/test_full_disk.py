"""A real full filesystem under the audit log, then under the state dir (SPEC §11, §12).

Each test mounts a small tmpfs of its own (`mount -t tmpfs -o size=...`, unmounted at the end)
and fills it with a filler file until the kernel says ENOSPC, so the proxy meets the same short
writes and errors as on a full disk. Mounting needs root: where the machine forbids it (not
root, or mount fails with EPERM) the tests skip and say so; any other mount failure fails.

The site's own request log is the truth: no request may reach the site without its line.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.proxy import ETIQUETTE, FAST_PACING, clean_env
from tests.e2e.sites import Answer, Site

GAP_REASON = "audit log not writable: No space left on device"
NOT_WRITABLE = "not writable: No space left on device"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[[str, str], Path]]:
    """`small_disk("audit", "256k")`: a tmpfs of that size mounted at tmp_path/NAME."""
    mounted: list[Path] = []

    def mount(name: str, size: str) -> Path:
        where = tmp_path / name
        where.mkdir(parents=True)
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs for a real full disk needs root; not root here")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
                              capture_output=True, text=True, timeout=30, check=False)
        if done.returncode != 0:
            said = done.stderr.lower()
            if "permission denied" in said or "not permitted" in said or "must be superuser" in said:
                pytest.skip(f"this machine forbids mounting a tmpfs (EPERM): {done.stderr.strip()}")
            pytest.fail(f"mount -t tmpfs failed: {done.stderr.strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:  # after the proxies (set up later, stopped first); lazily if still busy
        if subprocess.run(["umount", str(where)], capture_output=True, timeout=30, check=False).returncode:
            subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30, check=False)


def fill(disk: Path) -> Path:
    """Write a filler file until the filesystem is full (ENOSPC); its path, to free the space."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (65536, 4096, 512, 1):
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
    finally:
        os.close(fd)
    return filler


def new_stderr(proxy, since: int) -> list[str]:
    return [line for line in proxy.stderr()[since:].splitlines() if line.strip()]


def test_a_full_disk_under_the_audit_log_stops_requests_until_it_is_written_and_the_chain_holds(
        small_disk, start_proxy, site: Site, make_site, tls_files):
    site.route("/robots.txt", Answer(404))
    secure = make_site(tls=tls_files)
    disk = small_disk("audit", "256k")
    audit = disk / "audit.jsonl"
    proxy = start_proxy("--audit-log", str(audit), sets=[*FAST_PACING, f"upstream.ca_file={tls_files.ca}"])
    proxy.audit_path = audit
    with proxy.session() as s:
        for n in range(3):
            assert s.get(site.url(f"/before/{n}"), timeout=30).status_code == 200
    assert len(proxy.audit()) == 4  # robots.txt + 3
    filler = fill(disk)
    quiet = len(proxy.stderr())

    # Lines go on fitting in the slack of the file's last page; the request whose line no
    # longer fits reached the site (it was sent before), and from then on nothing leaves.
    refused: list[tuple[int, str, str]] = []  # every 503 a client got: (status, decision, body)
    with proxy.session() as s:
        for n in range(60):
            r = s.get(site.url(f"/during/{n}"), timeout=30)
            if r.status_code == 503:
                refused.append((r.status_code, r.headers.get("X-Etiquette-Decision", ""), r.text))
                break
            assert r.status_code == 200 and r.headers["X-Etiquette-Decision"] == "fetched"
    assert refused, "60 requests on a full disk and none refused"
    reached = len(site.paths())
    with proxy.session() as s:  # a keep-alive client, curl and urllib
        for n in range(10):
            r = s.get(site.url(f"/refused/requests/{n}"), timeout=30)
            refused.append((r.status_code, r.headers.get("X-Etiquette-Decision", ""), r.text))
    for n in range(5):
        status, headers, body = proxy.curl(site.url(f"/refused/curl/{n}"))
        refused.append((status, headers.get("x-etiquette-decision", ""), body.decode()))
        status, headers, body = proxy.curl(secure.url(f"/refused/https/{n}"))  # inside a CONNECT tunnel
        refused.append((status, headers.get("x-etiquette-decision", ""), body.decode()))
        status, raw = proxy.urllib_get(site.url(f"/refused/urllib/{n}"))
        refused.append((status, "paused" if GAP_REASON in raw.decode() else "?", raw.decode()))
    assert len(site.paths()) == reached, "a request reached the site while its line could not be written"
    assert secure.connections == 0  # not even a TCP connection (nor robots.txt) over HTTPS
    for status, decision, body in refused:
        assert (status, decision) == (503, "paused") and GAP_REASON in body and str(audit) in body, body
    said = new_stderr(proxy, quiet)
    assert len(said) == 1 and NOT_WRITABLE in said[0] and str(audit) in said[0], said

    os.remove(filler)
    deadline = time.monotonic() + 15  # the log is tried again at most once a second
    with proxy.session() as s:
        while True:
            r = s.get(site.url(f"/after/{len(refused)}"), timeout=30)
            if r.status_code == 200 or time.monotonic() > deadline:
                break
            refused.append((r.status_code, r.headers.get("X-Etiquette-Decision", ""), r.text))
            time.sleep(0.2)
    assert r.status_code == 200 and r.headers["X-Etiquette-Decision"] == "fetched"
    said = new_stderr(proxy, quiet)
    assert len(said) == 2 and "writable again" in said[1], said
    assert "Traceback" not in proxy.stderr()
    assert proxy.stop() == 0

    lines = proxy.audit()  # parses every line: whole lines only
    assert audit.read_bytes().endswith(b"\n")
    (gap,) = [r for r in lines if r.get("event") == "audit_gap"]
    assert gap["gap"]["error"] == "No space left on device" and gap["gap"]["lost"] == 0
    assert gap["gap"]["held"] >= 1 and gap["gap"]["refused"] == len(refused)
    # The site's own log: every request that reached it has its line, and no other line says so.
    at_site = sorted(site.paths())
    logged = sorted(r["url"].removeprefix(site.base) for r in lines if r["upstream_status"] is not None)
    assert logged == at_site
    assert [r["seq"] for r in lines] == list(range(1, len(lines) + 1))
    check = subprocess.run([ETIQUETTE, "verify-log", str(audit)], capture_output=True, text=True,
                           env=clean_env(), timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "torn" not in check.stdout


def test_a_full_state_dir_is_one_line_per_store_and_requests_go_on(small_disk, start_proxy, make_site, tmp_path):
    site, limited = make_site(), make_site()
    for s in (site, limited):
        s.route("/robots.txt", Answer(404))
    site.route("/gone", Answer(404, b"no"))
    limited.route("/slow", Answer(429, b"slow down", {"Retry-After": "1"}))
    disk = small_disk("full/state", "4m")  # the state dir itself; stderr and the audit log elsewhere
    audit = tmp_path / "audit.jsonl"
    proxy = start_proxy("--audit-log", str(audit), name="full/state", sets=FAST_PACING)
    proxy.audit_path = audit
    assert proxy.state_dir == disk
    page = Answer(200, b"<html>" + b"p" * 20_000 + b"</html>", {"Content-Type": "text/html", "ETag": '"v1"'})
    site.default = page
    with proxy.session() as s:  # robots.txt of both sites known before
        assert s.get(site.url("/warm"), timeout=30).status_code == 200
        assert s.get(limited.url("/warm"), timeout=30).status_code == 200
    filler = fill(disk)
    quiet = len(proxy.stderr())

    sent = 0
    with proxy.session() as s:
        for n in range(40):  # each would store a validator, a body and a revisit record
            assert s.get(site.url(f"/page/{n}"), timeout=30).headers["X-Etiquette-Decision"] == "fetched"
            sent += 1
        for _ in range(10):  # gone memory's record
            assert s.get(site.url("/gone"), timeout=30).status_code == 404
            sent += 1
        r = s.get(limited.url("/slow"), timeout=30)  # a pause to keep in the state store
        assert (r.status_code, r.headers["X-Etiquette-Decision"]) == (429, "throttled")
        sent += 1
    assert len([p for p in site.paths() + limited.paths() if p != "/robots.txt"]) == sent + 2  # + /warm
    said = new_stderr(proxy, quiet)
    assert "Traceback" not in proxy.stderr()
    # One line for each store, and pacing's note on the site's pause: nothing else.
    writes = [line for line in said if "write failed" in line]
    others = [line for line in said if "write failed" not in line]
    assert len(others) == 1 and "Retry-After: 1; pause" in others[0], said
    stores = sorted(re.search(r"(\w+ store) \S+: a write failed", line).group(1) for line in writes)
    assert stores == ["state store", "validator store"], said
    assert all("database or disk is full" in line for line in writes), said

    os.remove(filler)
    with proxy.session() as s:  # written again: the next copy is stored, then revalidated
        site.route("/after", Answer(200, b"<html>after</html>", {"Content-Type": "text/html", "ETag": '"a1"'}))
        site.route("/after", lambda a: Answer(304, b"", {"ETag": '"a1"'}) if a.headers.get("if-none-match") == '"a1"'
                   else Answer(200, b"<html>after</html>", {"Content-Type": "text/html", "ETag": '"a1"'}))
        assert s.get(site.url("/after"), timeout=30).headers["X-Etiquette-Decision"] == "fetched"
        second = s.get(site.url("/after"), timeout=30)
        assert second.headers["X-Etiquette-Decision"] == "revalidated" and second.text == "<html>after</html>"
    assert proxy.stop() == 0
    assert len(new_stderr(proxy, quiet)) <= len(said) + 2  # at most the shutdown's own lines
