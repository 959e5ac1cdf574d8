"""Profile the proxy's hot path under load (issue 8, part 4): py-spy on the real process.

Starts benchmarks/site.py and `etiquette-proxy run` (pacing out of the way, as in
overhead.py), warms up, then runs wrk for `--duration` seconds while `py-spy record` samples
the proxy process (by PID, non-idle samples only). Prints:
- the share of CPU samples spent under etiquette code (addons/ or etiquette_proxy/) — the
  part of the per-request cost that is ours, the rest being mitmproxy, asyncio and the kernel;
- the top functions of ours by inclusive share, and the top functions overall by self share.
Keeps the raw collapsed stacks if --keep DIR is given. `--target mitmdump` profiles bare
mitmdump the same way, for comparison.

    python benchmarks/profile_proxy.py [--duration 10] [--connections 16] [--keep DIR]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import BIN, header, start_etiquette, start_mitmdump, start_site, started, wrk  # noqa: E402
from overhead import FAST_PACING  # noqa: E402

OURS = ("addons/", "etiquette_proxy/", "etiquette_addons/")
ROOT_TEXT = str(Path(__file__).resolve().parent.parent) + "/"


def is_ours(frame: str) -> bool:
    """A frame in this checkout's code (py-spy shows paths relative to sys.path entries)."""
    path = frame.partition(" (")[2].removeprefix(ROOT_TEXT)
    if path.startswith(("addons/cli.py", "addons/etiquette.py")):
        return False  # the entry point is at the bottom of every stack: not per-request work
    return path.startswith(OURS) and "site-packages" not in path and "mitmproxy" not in path


def short(frame: str) -> str:
    # py-spy raw frames look like "func (path/to/file.py:123)"; keep the function and file name
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    parts = Path(path).parts
    tail = "/".join(parts[-2:]) if len(parts) >= 2 else path
    return f"{name} ({tail})"


def summarise(raw: Path, top: int) -> None:
    inclusive: Counter[str] = Counter()
    self_time: Counter[str] = Counter()
    ours_total = 0
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += count
        seen = set()
        for f in frames:
            key = short(f)
            if is_ours(f) and key not in seen:
                inclusive[key] += count
                seen.add(key)
        if any(is_ours(f) for f in frames):
            ours_total += count
        self_time[short(frames[-1])] += count
    if not total:
        print("no samples (is py-spy allowed to attach? try running as root)")
        return
    print(f"\n{total} CPU samples of the proxy process; under etiquette code: "
          f"{ours_total} ({100 * ours_total / total:.1f}%)")
    print(f"top {top} etiquette functions, inclusive % of all samples:")
    for key, n in inclusive.most_common(top):
        print(f"  {100 * n / total:5.1f}%  {key}")
    print(f"top {top} functions overall, self % of all samples:")
    for key, n in self_time.most_common(top):
        print(f"  {100 * n / total:5.1f}%  {key}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=int, default=10, help="seconds of load and sampling (default 10)")
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples/s (default 250)")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--keep", metavar="DIR", help="keep the raw stacks here")
    ap.add_argument("--target", choices=("etiquette", "mitmdump"), default="etiquette",
                    help="profile etiquette-proxy (default) or bare mitmdump, for comparison")
    args = ap.parse_args()
    if not 1 <= args.duration <= 120:
        ap.error("duration in 1..120 s")
    pyspy = shutil.which("py-spy", path=str(BIN)) or shutil.which("py-spy")
    if pyspy is None:
        sys.exit("py-spy is not installed: pip install py-spy")
    header(f"profile: py-spy on {args.target} under wrk load")
    with tempfile.TemporaryDirectory(prefix="etiquette-prof-") as tmp:
        out_dir = Path(args.keep) if args.keep else Path(tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        raw = out_dir / "proxy.collapsed"
        site = start_site()
        if args.target == "etiquette":
            ety = start_etiquette(Path(tmp) / "state", FAST_PACING)
        else:
            ety = start_mitmdump(Path(tmp) / "mitm")
        with started(site, ety):
            lua = ("proxy.lua", [site.url, "64"])
            wrk(ety.url, *lua, args.connections, 2)  # type: ignore[arg-type]  # warm-up
            cmd = [pyspy, "record", "--pid", str(ety.pid), "--duration", str(args.duration), "--rate",
                   str(args.rate), "--format", "raw", "--nonblocking", "-o", str(raw)]
            print("py-spy command:", " ".join(cmd))
            spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            time.sleep(0.5)
            r = wrk(ety.url, *lua, args.connections, args.duration, measure_pid=ety.pid)  # type: ignore[arg-type]
            try:
                _, err = spy.communicate(timeout=args.duration + 30)
            except subprocess.TimeoutExpired:
                spy.kill()
                _, err = spy.communicate(timeout=10)
            print(f"wrk: {r.command}\n  {r.rps:.1f} req/s, p50 {r.p50_ms:.2f} ms, p99 {r.p99_ms:.2f} ms "
                  f"proxy CPU {r.cpu_ms_per_request:.3f} ms/request (sampled at {args.rate}/s)")
            if spy.returncode not in (0, None) and not raw.exists():
                print("py-spy failed:", err.strip()[-500:])
                return 1
        summarise(raw, args.top)
        if args.keep:
            print(f"raw stacks kept in {raw}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
