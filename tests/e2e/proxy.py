"""The real proxy process for end-to-end tests, and real clients pointed at it."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import requests

ETIQUETTE = shutil.which("etiquette-proxy", path=os.path.dirname(sys.executable)) or "etiquette-proxy"

# The proxy must not inherit proxies or CA bundles from the machine (MITMPROXY-NOTES: this
# machine sets SSL_CERT_FILE, REQUESTS_CA_BUNDLE and CURL_CA_BUNDLE globally).
_SCRUB = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "all_proxy",
          "NO_PROXY", "no_proxy", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")


# Pacing (SPEC §5) applies to every request: 1/s, burst 1 by default. Tests whose subject is not
# pacing run with this, so a hundred requests to one local site do not take a hundred seconds.
FAST_PACING = ["pacing.rate=1000", "pacing.burst=100", "pacing.max_concurrency=16"]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    env.update(extra)
    return env


class Proxy:
    """`etiquette-proxy run --listen-port 0` in a subprocess; stopped by PID with SIGTERM."""

    def __init__(self, state_dir: Path, *args: str, config: str | None = None, sets: list[str] | None = None,
                 env: dict[str, str] | None = None, nofile: int | None = None):
        self.state_dir = state_dir
        self.audit_path = state_dir / "audit.jsonl"
        cmd = [ETIQUETTE, "run", "--listen-port", "0", "--state-dir", str(state_dir)]
        if config:
            cmd += ["--config", config]
        for s in sets or []:
            cmd += ["--set", s]
        cmd += list(args)
        self.cmd = cmd
        self.stderr_path = state_dir.parent / f"{state_dir.name}.stderr"
        state_dir.mkdir(parents=True, exist_ok=True)
        self._stderr = open(self.stderr_path, "ab")
        def limit() -> None:  # `nofile`: the proxy's open-file limit, soft and hard
            import resource

            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._stderr, env=env or clean_env(),
                                     text=True, preexec_fn=limit if nofile is not None else None)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("etiquette-proxy listening on http://"):
            self.proc.kill()
            raise RuntimeError(f"proxy did not start: {line!r}\n{self.stderr()}")
        self.url = line.strip().rsplit(" ", 1)[-1]
        self.port = int(self.url.rsplit(":", 1)[-1])

    @property
    def proxies(self) -> dict[str, str]:
        return {"http": self.url, "https": self.url}

    def ca(self) -> str:
        return str(self.state_dir / "mitmproxy-ca-cert.pem")

    def stderr(self) -> str:
        if not self._stderr.closed:
            self._stderr.flush()
        return self.stderr_path.read_text(errors="replace")

    def audit(self) -> list[dict[str, Any]]:
        if not self.audit_path.exists():
            return []
        return [json.loads(line) for line in self.audit_path.read_text().splitlines() if line.strip()]

    def audit_for(self, url_part: str) -> list[dict[str, Any]]:
        return [r for r in self.audit() if url_part in r["url"]]

    def wait_audit(self, predicate: Any, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Audit lines are written as decisions happen; wait until one matches."""
        deadline = time.monotonic() + timeout
        while True:
            lines = [r for r in self.audit() if predicate(r)]
            if lines or time.monotonic() > deadline:
                return lines
            time.sleep(0.05)

    def stop(self, timeout: float = 10.0) -> int:
        if self._stderr.closed:
            return self.proc.returncode
        end_by_pid(self.proc, timeout)
        self._stderr.close()
        if self.proc.stdout:
            self.proc.stdout.close()
        return self.proc.returncode

    def kill9(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self._stderr.close()

    # -- real clients -------------------------------------------------------------------------

    def held(self, site: str) -> int:
        """Requests the proxy holds for `site` ("127.0.0.1:PORT") now (/api/sites `live.held`)."""
        with self.session() as s:
            board = s.get("http://etiquette.proxy/api/sites", timeout=10).json()
        entry = next((e for e in board["sites"] if e["site"] == site), {})
        return int(entry.get("live", {}).get("held", 0))

    def session(self, ua: str = "testbot/1.0", verify: str | bool | None = None) -> requests.Session:
        """A requests session that reaches sites only through the proxy."""
        s = requests.Session()
        s.trust_env = False
        s.proxies = self.proxies
        s.headers["User-Agent"] = ua
        s.verify = verify if verify is not None else self.ca()
        return s

    def get(self, url: str, ua: str = "testbot/1.0", **kw: Any) -> requests.Response:
        with self.session(ua) as s:
            return s.get(url, timeout=kw.pop("timeout", 30), **kw)

    def curl(self, url: str, *args: str, ua: str = "curlbot/2.0") -> tuple[int, dict[str, str], bytes]:
        """curl through `http_proxy`/`https_proxy` in its environment (lower case: curl
        ignores upper-case HTTP_PROXY for http:// URLs)."""
        env = clean_env(http_proxy=self.url, https_proxy=self.url, CURL_CA_BUNDLE=self.ca())
        out = subprocess.run(["curl", "-s", "-i", "-A", ua, "--max-time", "30", *args, url],
                             env=env, capture_output=True, timeout=40, check=False)
        head, _, body = out.stdout.partition(b"\r\n\r\n")
        while b"connection established" in head.split(b"\r\n", 1)[0].lower():  # the CONNECT answer
            head, _, body = body.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1]) if lines and lines[0].startswith("HTTP") else 0
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        return status, headers, body

    def urllib_get(self, url: str, ua: str = "urllibbot/3.0") -> tuple[int, bytes]:
        import ssl

        handler = urllib.request.ProxyHandler(self.proxies)
        ctx = ssl.create_default_context(cafile=self.ca())
        opener = urllib.request.build_opener(handler, urllib.request.HTTPSHandler(context=ctx))
        req = urllib.request.Request(url, headers={"User-Agent": ua})
        try:
            with opener.open(req, timeout=30) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()


class KeepAliveUpstream:
    """A plain mitmproxy (mitmdump from this venv) as the upstream proxy `upstream.proxy` chains
    to: like a crawler's proxy pool it keeps each connection alive, so a client connection of
    the proxy under test keeps one connection to it per site. Stopped by PID."""

    def __init__(self, directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        mitmdump = shutil.which("mitmdump", path=os.path.dirname(sys.executable)) or "mitmdump"
        self.log_path = directory / "mitmdump.log"
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [mitmdump, "--listen-host", "127.0.0.1", "--listen-port", "0", "--set", f"confdir={directory}",
             "--set", "flow_detail=0"], stdout=self._log, stderr=subprocess.STDOUT, env=clean_env())
        deadline = time.monotonic() + 30
        while (m := re.search(rb"listening at 127\.0\.0\.1:(\d+)", self.log_path.read_bytes())) is None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"mitmdump did not start: {self.log_path.read_text(errors='replace')}")
            time.sleep(0.05)
        self.port = int(m.group(1))
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        end_by_pid(self.proc)
        self._log.close()


def end_by_pid(proc: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """SIGTERM to a process this test started, SIGKILL if it is still there after `timeout`."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
