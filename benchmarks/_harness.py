"""Shared pieces of the benchmark scripts: processes we start (and stop by PID), wrk, figures.

Loopback only. Every process started here is stopped by its own PID (SIGTERM, then SIGKILL
after a grace period); every wait is bounded.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BIN = Path(sys.executable).parent

# The proxy must not inherit the machine's proxies or CA bundles (MITMPROXY-NOTES).
_SCRUB = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "all_proxy",
          "NO_PROXY", "no_proxy", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")


def clean_env(pythonpath: str | None = None) -> dict[str, str]:
    """The environment for processes we start: this checkout's code (or `pythonpath`'s)."""
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    env["PYTHONPATH"] = pythonpath or str(ROOT)
    return env


def header(title: str) -> None:
    """Print what is measured, the exact command, and the machine."""
    cmd = " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv])
    print(f"== {title}")
    print(f"command: {cmd}")
    try:
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        rev = "?"
    print(f"commit {rev}; python {platform.python_version()}; {os.cpu_count()} CPUs; "
          f"{time.strftime('%Y-%m-%d %H:%M:%S')}")
    sys.stdout.flush()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


@dataclass
class Started:
    name: str
    proc: subprocess.Popen[str]
    url: str

    @property
    def pid(self) -> int:
        return self.proc.pid


def stop(p: Started, grace: float = 10.0) -> None:
    """SIGTERM this one process by PID, SIGKILL it after `grace` seconds."""
    if p.proc.poll() is None:
        os.kill(p.pid, signal.SIGTERM)
        try:
            p.proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGKILL)
            p.proc.wait(5)
    for stream in (p.proc.stdout, p.proc.stderr):
        if stream:
            stream.close()


@contextmanager
def started(*procs: Started) -> Iterator[None]:
    try:
        yield
    finally:
        for p in reversed(procs):
            stop(p)


def _ready_line(proc: subprocess.Popen[str], prefix: str, timeout: float = 30.0) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    os.set_blocking(proc.stdout.fileno(), True)
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    while time.monotonic() < deadline:
        if sel.select(timeout=0.2):
            line = proc.stdout.readline()
            if line.startswith(prefix):
                return line.strip().rsplit(" ", 1)[-1]
            if not line and proc.poll() is not None:
                break
    proc.kill()
    proc.wait(5)
    raise RuntimeError(f"no {prefix!r} line from pid {proc.pid} within {timeout}s")


def start_site(body: int = 1024, validators: bool = True, tls: tuple[Path, Path] | None = None) -> Started:
    """benchmarks/site.py; `validators=False`: no ETag/Last-Modified; `tls`: (cert, key), HTTPS."""
    cmd = [sys.executable, str(HERE / "site.py"), "--port", "0", "--body", str(body)]
    cmd += [] if validators else ["--no-validators"]
    cmd += ["--tls", str(tls[0]), str(tls[1])] if tls else []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=clean_env())
    return Started("site", proc, _ready_line(proc, "site listening on "))


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A throwaway certificate and key for 127.0.0.1 (openssl), for an HTTPS bench site."""
    cert, key = directory / "site-cert.pem", directory / "site-key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    return cert, key


def checkout_path(checkout: Path, scratch: Path) -> str:
    """A PYTHONPATH under which `addons` and `etiquette_proxy` are `checkout`'s own.

    `checkout` is another checkout of this repository (`git worktree add /tmp/before main`,
    or `git archive BASE` unpacked): it holds `addons/` (installed as `addons`) and
    `etiquette_proxy/`. PYTHONPATH=checkout alone is not enough: it has no `addons`
    folder, so the editable install's finder would hand out *this* checkout's addons over the
    other checkout's core — a mixed proxy that fails at import once the two disagree (that is
    how `overhead.py --before DIR` failed to start), or, worse, measures the wrong code. So the
    two packages are linked side by side in `scratch`, and the interpreter is asked where they
    resolve from before any proxy starts; a mismatch stops the benchmark, naming both paths.
    """
    checkout = checkout.resolve()
    addons, core = checkout / "addons", checkout / "etiquette_proxy"
    for need in (addons / "cli.py", core / "__init__.py"):
        if not need.is_file():
            raise SystemExit(f"--before {checkout}: {need} is missing (expected a checkout of etiquette-proxy)")
    scratch.mkdir(parents=True, exist_ok=True)
    for name, target in (("addons", addons), ("etiquette_proxy", core)):
        link = scratch / name
        if not link.is_symlink():
            link.symlink_to(target, target_is_directory=True)
    probe = ("import addons.cli, etiquette_proxy.config, os; "
             "print(os.path.realpath(addons.cli.__file__)); "
             "print(os.path.realpath(etiquette_proxy.config.__file__))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                         env=clean_env(str(scratch)), cwd=scratch)  # not our cwd: `-c` puts it first on sys.path
    got = out.stdout.split()
    want = [str(addons / "cli.py"), str(core / "config.py")]
    if out.returncode != 0 or got != want:
        raise SystemExit(f"--before {checkout}: its packages do not import as its own (wanted {want}, "
                         f"got {got}); stderr: {out.stderr.strip()[-600:]}")
    return str(scratch)


def same_checkout(other_checkout: str) -> None:
    """In a before arm (the environment variable `other_checkout` set), both packages must come
    from the other checkout's PYTHONPATH entry (checkout_path's links), or the figures mix two
    trees."""
    if not os.environ.get(other_checkout):
        return
    import addons

    import etiquette_proxy

    want = Path(os.environ["PYTHONPATH"].split(os.pathsep)[0])
    for module in (addons, etiquette_proxy):
        got = Path(str(module.__file__)).parent
        if got != want / module.__name__:
            raise SystemExit(f"before arm: {module.__name__} imported from {got}, not from {want}")


ASSERTS_ENV = "ETIQUETTE_PROXY_ASSERTS"  # addons/cli.py: `run` keeps assertions, no restart


def etiquette_command(state_dir: Path, sets: Sequence[str] = (), extra: Sequence[str] = (),
                      optimize: bool = True) -> list[str]:
    """`etiquette-proxy run` as `python -O` from the start: `run` restarts itself under -O
    (addons/cli.py `_optimized`), which a tracer started with it (valgrind, strace) would not
    follow; started so, a checkout from before that restart (`--before`) runs under -O too,
    and an arm's figures compare the chain's code alone. `optimize=False`: with assertions
    (start it with ASSERTS_ENV set, or `run` restarts itself under -O)."""
    exe = shutil.which("etiquette-proxy", path=str(BIN))
    if exe is None:
        raise SystemExit(f"etiquette-proxy is not installed in {BIN}: pip install -e '.[test]'")
    cmd = [sys.executable, *(["-O"] if optimize else []), exe,
           "run", "--listen-port", "0", "--state-dir", str(state_dir)]
    for s in sets:
        cmd += ["--set", s]
    return cmd + list(extra)


def start_etiquette(state_dir: Path, sets: Sequence[str] = (), prefix: Sequence[str] = (),
                    pythonpath: str | None = None, optimize: bool = True) -> Started:
    """The real proxy process (console script of this venv); `prefix` e.g. a profiler;
    `pythonpath` a directory holding another checkout's addons and etiquette_proxy."""
    state_dir.mkdir(parents=True, exist_ok=True)
    stderr = open(state_dir.parent / f"{state_dir.name}.stderr", "ab")
    own = etiquette_command(state_dir, sets, optimize=optimize)  # [python, (-O), script, run, ...]
    cmd = [*prefix, *own]
    if prefix and prefix[0] == sys.executable:  # a Python runner (cProfile...) runs the script itself
        flags = own[1:own.index("run") - 1]
        cmd = [sys.executable, *flags, *prefix[1:], *own[1 + len(flags):]]
    env = clean_env(pythonpath)
    if not optimize:
        env[ASSERTS_ENV] = "1"
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
    stderr.close()
    try:
        url = _ready_line(proc, "etiquette-proxy listening on ")
    except RuntimeError as e:
        tail = (state_dir.parent / f"{state_dir.name}.stderr").read_text(errors="replace")[-1500:]
        raise RuntimeError(f"{e}; its stderr ends:\n{tail}") from None
    return Started("etiquette-proxy", proc, url)


def start_mitmdump(confdir: Path, extra: Sequence[str] = (), prefix: Sequence[str] = (),
                   pythonpath: str | None = None) -> Started:
    """Bare mitmdump, no addons of ours, quiet (no flow printing); `extra` mitmdump arguments
    (e.g. `--mode reverse:https://...`, `-s addons/etiquette.py`), `prefix` e.g. a profiler."""
    confdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    exe = shutil.which("mitmdump", path=str(BIN)) or "mitmdump"
    cmd = [*prefix, exe, "-q", "--listen-host", "127.0.0.1", "--listen-port", str(port), "--set",
           f"confdir={confdir}", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
                            env=clean_env(pythonpath))
    try:
        wait_port(port)
    except RuntimeError:
        proc.kill()
        proc.wait(5)
        raise
    return Started("mitmdump", proc, f"http://127.0.0.1:{port}")


def _start_master(script: str, confdir: Path, port: int, extra: Sequence[str], prefix: Sequence[str],
                  pythonpath: str | None, name: str, python_flags: Sequence[str] = (),
                  timeout: float = 90.0) -> Started:
    """A benchmark master script of this folder on `port`, its stderr kept in `confdir`."""
    confdir.mkdir(parents=True, exist_ok=True)
    cmd = [*prefix, sys.executable, *python_flags, str(HERE / script), "--port", str(port),
           "--confdir", str(confdir), *extra]
    stderr = open(confdir / "stderr", "ab")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=stderr, text=True, env=clean_env(pythonpath))
    stderr.close()
    try:
        wait_port(port, timeout)  # mitmproxy's imports alone take tens of seconds on a loaded machine
    except RuntimeError:
        proc.kill()
        proc.wait(5)
        raise RuntimeError(f"{cmd} did not listen; its stderr ends:\n"
                           f"{(confdir / 'stderr').read_text(errors='replace')[-1500:]}") from None
    return Started(name, proc, f"http://127.0.0.1:{port}")


def start_product_master(confdir: Path, extra: Sequence[str] = (), prefix: Sequence[str] = (),
                         pythonpath: str | None = None, optimize: bool = True, timeout: float = 90.0) -> Started:
    """`run`'s own mitmproxy master (benchmarks/_product_master.py): with no `extra`, lean
    mitmproxy with no etiquette addon; `extra` e.g. `--chain STATE --reverse URL`."""
    return _start_master("_product_master.py", confdir, free_port(), extra, prefix, pythonpath,
                         "mitmproxy, run's master, no etiquette addon", ["-O"] if optimize else [],  # as `run`
                         timeout)


def start_lean(confdir: Path, extra: Sequence[str] = (), prefix: Sequence[str] = (),
               port: int | None = None, timeout: float = 90.0) -> Started:
    """(b') the leanest mitmproxy (benchmarks/_lean_master.py: a plain Master with mitmproxy's
    core, proxyserver, next_layer and tlsconfig, no code of ours), under `python -O` (its
    docstring says why); `extra` e.g. `--reverse URL`, `--reuse-port` (then `port` is shared)."""
    return _start_master("_lean_master.py", confdir, port or free_port(), extra, prefix, None,
                         "lean mitmproxy (core, proxyserver, next_layer, tlsconfig)", ["-O"], timeout)


def load_average() -> str:
    """`load average 1.23 0.98 0.71` (1, 5, 15 minutes): printed with every figure."""
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


# -- wrk ------------------------------------------------------------------------------------------

@dataclass
class WrkResult:
    rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    errors: int  # socket errors + non-2xx/3xx
    command: str
    cpu_ms_per_request: float | None = None  # of the process passed as `measure_pid`


_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if not m:
        raise ValueError(f"not a wrk duration: {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def wrk(url: str, lua: str, lua_args: Sequence[str], connections: int, duration_s: float,
        threads: int = 2, measure_pid: int | None = None, close: bool = False) -> WrkResult:
    """One bounded wrk run (`-d`), latency distribution on; wrk's own timeout 10 s.

    With `measure_pid`, also the CPU time that process used per request during the run; with
    `close`, every request on a new connection (`Connection: close`).
    """
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed: apt-get install -y wrk")
    threads = max(1, min(threads, connections))
    cmd = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{duration_s:g}s", "--timeout", "10s", "--latency",
           *(["-H", "Connection: close"] if close else []), "-s", str(HERE / lua), url, "--", *lua_args]
    cpu0 = cpu_seconds(measure_pid) if measure_pid else 0.0
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration_s + 60).stdout
    cpu = cpu_seconds(measure_pid) - cpu0 if measure_pid else None
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p50 = _ms(re.search(r"\s50%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    p99 = _ms(re.search(r"\s99%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    errors = 0
    if m := re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out):
        errors += sum(int(x) for x in m.groups())
    if m := re.search(r"Non-2xx or 3xx responses: (\d+)", out):
        errors += int(m.group(1))
    shown = " ".join(shlex.quote(os.path.relpath(a, ROOT) if a.startswith(str(ROOT)) else a) for a in cmd)
    per_request = None if cpu is None or not requests else 1000 * cpu / requests
    return WrkResult(rps, p50, p99, requests, errors, shown, per_request)


def audit_summary(path: Path) -> str:
    """`N lines: fetched 7000, revalidated 12` from an audit log."""
    if not path.exists():
        return "no audit log"
    counts: Counter[str] = Counter()
    n = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            n += 1
            try:
                counts[json.loads(line).get("outcome", "?")] += 1
            except ValueError:
                counts["(torn)"] += 1
    return f"{n} lines: " + ", ".join(f"{k} {v}" for k, v in counts.most_common())


# -- figures --------------------------------------------------------------------------------------

def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def percentile(sorted_xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted sequence."""
    if not sorted_xs:
        return float("nan")
    k = min(len(sorted_xs) - 1, max(0, int(round(q / 100 * len(sorted_xs) + 0.5)) - 1))
    return sorted_xs[k]


def rss_mb() -> float:
    """Resident memory of this process, MB (VmRSS)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (/proc/PID/stat), seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def dir_size_mb(path: Path) -> float:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total / 1024**2


def check(label: str, ok: bool, detail: str) -> str:
    return f"  {'PASS' if ok else 'MISS'}  {label}: {detail}"
