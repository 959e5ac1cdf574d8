"""`etiquette-proxy run` as a child process of another command (SPEC §3): `wrap`, and the
pytest fixture (etiquette_proxy/pytest_plugin.py). Standard library only: the fixture's plugin
imports this when a test first asks for a proxy, never at pytest's start."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
from collections.abc import Sequence

READY_PREFIX = "etiquette-proxy listening on "  # SPEC §3: the one line `run` prints when ready
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0  # SPEC §3: a clean stop takes at most 5 s
STATE_ENV = "ETIQUETTE_STATE_DIR"


class ChildProxyError(RuntimeError):
    """The proxy did not start; the message ends with its log's last lines."""


def start_child_proxy(state_dir: str, run_args: Sequence[str], log_path: str) -> tuple[subprocess.Popen[str], str]:
    """`run` on a free loopback port with `state_dir`, its stderr to `log_path` (0600): the
    process and the URL it listens on, once it says it is ready."""
    cmd = [sys.executable, "-m", "addons.cli", "run", "--listen-host", "127.0.0.1", "--listen-port", "0",
           *run_args, "--state-dir", state_dir]
    # The child's own state dir, not one inherited from a wrapped shell (`env`, `wrap` export it).
    env = {k: v for k, v in os.environ.items() if k != STATE_ENV}
    with open(log_path, "ab") as log_file:
        os.chmod(log_path, 0o600)
        # Its own session: a Ctrl-C at the terminal reaches the tool, and the proxy outlives it
        # long enough to log the tool's last requests.
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log_file, text=True, env=env,
                                start_new_session=True)
    line = _first_line(proc, START_TIMEOUT_S)
    if not line.startswith(READY_PREFIX):
        stop_child_proxy(proc)
        with open(log_path, errors="replace") as f:
            tail = f.read()[-2000:]
        raise ChildProxyError(f"the proxy did not start (log {log_path}):\n{tail}")
    return proc, line.strip()[len(READY_PREFIX):]


def stop_child_proxy(proc: subprocess.Popen[str]) -> int:
    """SIGTERM, as SPEC §3 asks (a clean stop, the audit log flushed); SIGKILL past STOP_TIMEOUT_S."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
    return proc.returncode


def _first_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            return ""
    return proc.stdout.readline()
