"""What the start-up state check costs (SPEC §12): reading the audit log back for pauses, and
checking the SQLite stores.

    .venv/bin/python benchmarks/state_check.py [--log-mb 256] [--rows 100000]

Writes, in a temporary directory, an audit log of `--log-mb` MiB of ordinary `fetched` lines
(as the proxy writes them, chained) with a 429 line every 10,000 lines and one state store of
`--rows` pacing rows; then times, each a few times (median): `rebuild_from_log` into an empty
store (the store lost everything: every site paused within the window is put back) and
`damage()` on the store (read-only open, schema, PRAGMA quick_check). The log's lines are all
within the rebuild window, so the whole file (up to SCAN_BYTES) is read: the worst case.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from etiquette_proxy.audit.log import AuditLog, audit_record  # noqa: E402
from etiquette_proxy.config import defaults  # noqa: E402
from etiquette_proxy.state.local import DiskState, damage  # noqa: E402
from etiquette_proxy.state.memory import MemoryState  # noqa: E402
from etiquette_proxy.pacing.rebuild import SCAN_BYTES, rebuild_from_log  # noqa: E402


def write_log(path: str, megabytes: float, now: float) -> tuple[int, int]:
    log = AuditLog(path, clock=lambda: now)
    lines = throttles = 0
    target = megabytes * 2**20
    t = now - 1800.0  # half an hour of crawl, all of it within the default 1 h window
    step = 1800.0 / max(1.0, target / 420)
    while os.path.getsize(path) < target:
        for _ in range(1000):
            lines += 1
            site = f"site{lines % 5000}.test:443"
            if lines % 10_000 == 0:
                throttles += 1
                site = f"paused{throttles}.test:443"
                log.write(audit_record(
                    ts=t, outcome="throttled", method="GET", url=f"https://{site}/p/{lines}", site=site,
                    status=429, upstream_status=429, waited_s=0.0, rate=0.5, reason="Retry-After: 3600",
                    client_ua="bench/1.0", pause_s=3600.0, retry_after="3600", ceiling=0.8,
                    pause_until=time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(t + 3600))))
            else:
                log.write(audit_record(
                    ts=t, outcome="fetched", method="GET", url=f"https://{site}/p/{lines}", site=site,
                    status=200, upstream_status=200, waited_s=0.012, rate=1.0, reason="", client_ua="bench/1.0",
                    robots="allow", header_bytes=312, bytes=18_000))
            t += step
    log.close()
    return lines, throttles


def timed(fn, runs: int) -> float:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        out.append(time.perf_counter() - started)
    return statistics.median(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log-mb", type=float, default=256.0)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    now = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "audit.jsonl")
        lines, throttles = write_log(path, args.log_mb, now)
        size = os.path.getsize(path)
        config = defaults()
        restored: list[int] = []

        def rebuild() -> None:
            restored.append(len(rebuild_from_log(MemoryState(), path, config, now).restored))

        scan = timed(rebuild, args.runs)
        state_dir = os.path.join(tmp, "state")
        state = DiskState(state_dir)
        for i in range(args.rows):
            state.put("pacing", f"site{i}.test:443", {"v": 1, "rate": 0.5, "ceiling": 0.8})
        state.close()
        db = os.path.join(state_dir, "cache.db")
        check = timed(lambda: damage(db), args.runs)
        print(f"command: {' '.join([os.path.basename(sys.executable), *sys.argv])}")
        print(f"audit log: {size / 2**20:.1f} MiB, {lines} lines, {throttles} throttling lines "
              f"(read back at most {SCAN_BYTES // 2**20} MiB)")
        print(f"rebuild_from_log (empty store): {scan * 1000:.0f} ms median of {args.runs}, "
              f"{restored[-1]} sites put back, {size / 2**20 / scan:.0f} MiB/s")
        print(f"state store: {args.rows} rows, {os.path.getsize(db) / 2**20:.1f} MiB; "
              f"damage() (open, schema, quick_check): {check * 1000:.0f} ms median of {args.runs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
