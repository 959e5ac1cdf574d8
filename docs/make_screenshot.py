"""Regenerate docs/dashboard.png and docs/report-example.txt from a real run.

    .venv/bin/python docs/make_screenshot.py

Starts the real proxy and three local sites (loopback only), crawls them a little through
the proxy, then photographs http://etiquette.proxy/ with headless Chromium and runs
`etiquette-proxy report` on the run's audit log. Whatever features are on the branch show up.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.e2e.browser import screenshot  # noqa: E402
from tests.e2e.proxy import ETIQUETTE, Proxy, clean_env  # noqa: E402
from tests.e2e.sites import Answer, Arrival, Site  # noqa: E402


def main() -> int:
    shop, archive, api = Site(), Site(), Site()
    shop.route("/robots.txt", Answer(200, b"User-agent: *\nDisallow: /private/\nDisallow: /cart\n"))
    archive.route("/robots.txt", Answer(404, b"no robots here\n"))
    csp = "default-src 'self'; " + "; ".join(f"script-src-elem https://cdn{i}.example" for i in range(40))
    archive.route("/old", Answer(410, b"gone\n", {"Content-Security-Policy": csp, "Link": "</s.css>; rel=preload"}))
    api.route("/robots.txt", Answer(200, b"User-agent: *\nDisallow: /\n"))

    def catalog(arrival: Arrival) -> Answer:
        # pages with validators: the second pass is answered 304 and revalidated
        etag = '"v1-' + arrival.path.rsplit("/", 1)[-1] + '"'
        if arrival.headers.get("if-none-match") == etag:
            return Answer(304, b"", {"ETag": etag})
        return Answer(200, b"<html><body>" + b"product " * 400 + b"</body></html>",
                      {"Content-Type": "text/html", "ETag": etag})

    for i in range(40):
        shop.route(f"/catalog/{i}", catalog)
    shop.route("/catalog/9", Answer(429, b"slow down\n", {"Retry-After": "1"}))
    with tempfile.TemporaryDirectory() as tmp:
        proxy = Proxy(Path(tmp) / "state", sets=["pacing.rate=20", "pacing.burst=5", "health.window=1s",
                                                 "health.min_requests=10"])
        try:
            with proxy.session(ua="examplebot/1.0") as s:
                for _ in range(2):  # about 6 s at 20/s: four health windows, then a score
                    for i in range(40):
                        s.get(shop.url(f"/catalog/{i}"), timeout=30)
                for path in ("/private/report", "/cart", "/private/x", "/catalog/9"):
                    s.get(shop.url(path), timeout=30)
                time.sleep(1.1)
                s.get(shop.url("/catalog/10"), timeout=30)
                for path in ("/", "/a", "/old", "/old"):
                    s.get(archive.url(path), timeout=30)
                s.get(api.url("/v1/items"), timeout=30)
            out = ROOT / "docs" / "dashboard.png"
            screenshot(proxy.port, Path(tmp) / "profile", out, size="1180,660")
            report = subprocess.run([ETIQUETTE, "report", str(proxy.audit_path)], capture_output=True,
                                    text=True, env=clean_env(), check=True)
            text = report.stdout.replace(str(proxy.audit_path), "audit.jsonl")
            (ROOT / "docs" / "report-example.txt").write_text(text)
            print(f"wrote {out} ({os.path.getsize(out):,} bytes) and docs/report-example.txt")
        finally:
            proxy.stop()
            for site in (shop, archive, api):
                site.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
