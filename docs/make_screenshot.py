"""Regenerate docs/dashboard.png and docs/report-example.txt from a real run.

    .venv/bin/python docs/make_screenshot.py

Starts the real proxy and forty local sites (loopback only, tests/e2e/fleet.py) in the states an
operator meets: healthy, paused by a 429, a breaker tripped, paused by the operator, two sites
whose health really slides to hostile and one to degrading, robots.txt unreachable, a
Crawl-delay, 410s, revalidated pages. Then photographs http://etiquette.proxy/ with headless
Chromium and runs `etiquette-proxy report` on the run's audit log. About a minute.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.e2e.browser import screenshot  # noqa: E402
from tests.e2e.fleet import crawl, drive_health, make_fleet, start  # noqa: E402
from tests.e2e.proxy import ETIQUETTE, clean_env  # noqa: E402

SIZE = "1500,950"


def main() -> int:
    fleet = make_fleet(drift=True)
    with tempfile.TemporaryDirectory() as tmp:
        proxy = start(fleet, Path(tmp), "pacing.rate=15", "pacing.burst=5", "pacing.max_concurrency=4",
                      "health.window=1s", "health.min_requests=10")
        try:
            crawl(fleet, proxy)
            seen = drive_health(fleet, proxy)
            print("band changes:", seen)
            out = ROOT / "docs" / "dashboard.png"
            screenshot(proxy.port, Path(tmp) / "profile", out, size=SIZE)
            report = subprocess.run([ETIQUETTE, "report", str(proxy.audit_path)], capture_output=True,
                                    text=True, env=clean_env(), check=True)
            text = report.stdout.replace(str(proxy.audit_path), "audit.jsonl")
            (ROOT / "docs" / "report-example.txt").write_text(text)
            print(f"wrote {out} ({os.path.getsize(out):,} bytes) and docs/report-example.txt")
        finally:
            proxy.stop()
            fleet.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
