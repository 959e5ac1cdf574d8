"""Issue 17: the cheaper per-request path still writes one chained audit line per decision.

The audit writer, the board and the header reads were made cheaper; these tests would fail if
a fast path skipped a line, wrote a line that disagrees with what reached the site, or broke
the hash chain (SPEC §3, §11).
"""

from __future__ import annotations

import json
import subprocess
import time

from etiquette_proxy.audit.hash_chain import split_line
from etiquette_proxy.audit.log import REQUIRED_KEYS
from tests.e2e.proxy import ETIQUETTE, FAST_PACING, clean_env
from tests.e2e.sites import Answer


def test_every_request_of_a_mixed_crawl_has_one_chained_line_matching_the_site(start_proxy, site):
    site.route("/robots.txt", Answer(200, b"User-agent: *\nDisallow: /private/\n"))
    site.route("/etag", lambda a: Answer(304, b"", {"ETag": '"v1"'}) if a.headers.get("if-none-match") == '"v1"'
               else Answer(200, b"<html>v1</html>", {"Content-Type": "text/html", "ETag": '"v1"'}))
    site.route("/slow-down", Answer(429, b"", {"Retry-After": "1", "retry-AFTER": "2",
                                               "RateLimit-Policy": '"q";q=100;w=60'}))
    proxy = start_proxy(sets=FAST_PACING)
    sent: list[tuple[str, int]] = []  # (path, status the client got)
    with proxy.session() as s:
        for round_ in range(3):
            for path in (f"/plain/{round_}", "/etag", "/private/x", "/etag"):
                sent.append((path, s.get(site.url(path), timeout=30).status_code))
        sent.append(("/slow-down", s.get(site.url("/slow-down"), timeout=30).status_code))
    deadline = time.monotonic() + 10  # lines are written as decisions happen
    while len([r for r in proxy.audit() if not r.get("robots_fetch")]) < len(sent) and time.monotonic() < deadline:
        time.sleep(0.05)
    lines = [r for r in proxy.audit() if not r.get("robots_fetch")]

    # One line per request, in order, each with every required key and the client's status.
    assert [(r["url"].removeprefix(site.base), r["status"]) for r in lines] == sent
    for r in lines:
        assert set(REQUIRED_KEYS) <= set(r) and r["client_ua"] == "testbot/1.0"
    outcomes = [r["outcome"] for r in lines]
    assert outcomes.count("disallowed") == 3 and outcomes.count("revalidated") >= 4
    # What the lines say reached the site is what the site's own log holds.
    reached = [r["url"].removeprefix(site.base) for r in lines if r["upstream_status"] is not None]
    assert sorted(reached) == sorted(p for p in site.paths() if p != "/robots.txt")
    assert "/private/x" not in site.paths()
    # The 429 with a repeated, differently-cased Retry-After: every value reached pacing.
    (throttled,) = [r for r in lines if r["url"].endswith("/slow-down")]
    assert throttled["outcome"] == "throttled" and throttled["upstream_status"] == 429
    assert throttled["retry_after"] == "1, 2"  # both fields, joined in order

    proxy.stop()
    check = subprocess.run([ETIQUETTE, "verify-log", str(proxy.audit_path)], capture_output=True, text=True,
                           env=clean_env(), timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"{len(proxy.audit()):,} chained line(s)" in check.stdout

    # Byte for byte what json.dumps writes for each line's record (the encoder is orjson where it
    # writes the same bytes): parsing a line and dumping it again gives its bytes back.
    for raw in proxy.audit_path.read_bytes().splitlines():
        parts = split_line(raw)
        assert parts is not None, raw
        body, _, seq = parts
        record = {k: v for k, v in json.loads(raw).items() if k not in ("seq", "chain")}
        text = json.dumps(record, ensure_ascii=False, separators=(",", ":"), default=str)
        assert body == (text[:-1] + f',"seq":{seq}').encode("utf-8", errors="replace"), raw
