"""The commands that work with a proxy from outside it (SPEC §3): `wrap`, `env`, `ca`, `sites`.

They find a running proxy through its state dir (`proxy-url`, `operator-token`, see
controls.py). The state dir is `--state-dir`, else `ETIQUETTE_STATE_DIR` (which
`env` and `wrap` export, so the commands work inside a wrapped tool), else the configured one.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import IO, Any
from urllib.parse import urlsplit

from etiquette_proxy.operate.child_proxy import STATE_ENV, ChildProxyError, start_child_proxy, stop_child_proxy
from etiquette_proxy.operate.client_env import (
    BUNDLE_NAME,
    WGETRC_NAME,
    client_env,
    combined_bundle,
    export_lines,
    system_bundle,
    wgetrc_text,
)
from etiquette_proxy.operate.controls import (
    CLIENT_HEADER,
    ROUTE,
    TOKEN_HEADER,
    URL_FILE,
    read_token,
    read_url,
    write_private,
)
from etiquette_proxy.visibility.page import HOST, pause_words
from etiquette_proxy.visibility.report import BELOW_GRADE_EXIT, Gate, Report, load_report, publish

CA_NAME = "mitmproxy-ca-cert.pem"
# Signals a wrapper passes on (SIGINT only when no terminal delivers it to the tool itself).
FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


class CommandError(Exception):
    """A problem the user must fix: printed as `etiquette-proxy CMD: message`, exit code."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def chosen_state_dir(given: str | None, configured: str, environ: Mapping[str, str] = os.environ) -> str:
    """--state-dir, else ETIQUETTE_STATE_DIR, else the config's state.dir."""
    path = given or environ.get(STATE_ENV) or configured
    return os.path.abspath(os.path.expanduser(path))


# -- ca, env --------------------------------------------------------------------------------------

def ca_command(state_dir: str, err: IO[str], ensure_ca: Callable[[str], str]) -> int:
    """Print the CA path (`ensure_ca(state_dir)` makes it where it is missing); say on stderr
    which state dir was read and whether a proxy runs there."""
    url = read_url(state_dir)
    path = ensure_ca(state_dir)
    if url and _listening(url):
        err.write(f"etiquette-proxy ca: the proxy at {url} (state dir {state_dir})\n")
    elif url:
        err.write(f"etiquette-proxy ca: {_gone(url, state_dir)}; this is its CA\n")
    else:
        err.write(f"etiquette-proxy ca: no proxy is running with state dir {state_dir}; this is its CA "
                  f"(another state dir? pass --state-dir)\n")
    print(path)
    return 0


def client_files(state_dir: str, proxy_url: str, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Write the CA bundle and wgetrc beside the proxy's CA (0600); the child's variables."""
    ca = os.path.join(state_dir, CA_NAME)
    if not os.path.exists(ca):
        raise CommandError(f"no CA certificate in {state_dir} (has a proxy ever run with this state dir?)")
    with open(ca, encoding="ascii") as f:
        ca_pem = f.read()
    system_pem = ""
    system = system_bundle(environ)
    if system and os.path.realpath(system) != os.path.realpath(os.path.join(state_dir, BUNDLE_NAME)):
        with open(system, encoding="utf-8", errors="replace") as f:
            system_pem = f.read()
    bundle = os.path.join(state_dir, BUNDLE_NAME)
    write_private(bundle, combined_bundle(ca_pem, system_pem))
    wgetrc = os.path.join(state_dir, WGETRC_NAME)
    write_private(wgetrc, wgetrc_text(proxy_url, bundle))
    env = client_env(proxy_url, ca, bundle, wgetrc)
    env[STATE_ENV] = state_dir
    return env


def env_command(state_dir: str, proxy: str | None) -> int:
    url = proxy or read_url(state_dir)
    if not url:
        raise CommandError(f"no proxy is running with state dir {state_dir} (no {URL_FILE} there): start one "
                           "with `./run-proxy`, or pass --state-dir D or --proxy URL")
    if not proxy and not _listening(url):
        # Exporting a dead proxy's address would make every client fail with "connection refused".
        raise CommandError(_gone(url, state_dir) + ": start it again with `./run-proxy`")
    sys.stdout.write(export_lines(client_files(state_dir, url)))
    return 0


# -- sites ----------------------------------------------------------------------------------------

def _proxy_request(url: str, method: str, path: str, body: bytes = b"",
                   headers: Mapping[str, str] | None = None, proxy_auth: str | None = None) -> tuple[int, bytes]:
    """One request to http://etiquette.proxy/PATH through the proxy at `url` (no proxy
    variables, no no_proxy: straight to the proxy, in absolute form). `proxy_auth`
    (`user:password`, SPEC §12 `listen.proxyauth`) goes as Basic `Proxy-Authorization`."""
    parts = urlsplit(url)
    sent = {"Host": HOST, **(headers or {})}
    if proxy_auth:
        sent["Proxy-Authorization"] = "Basic " + base64.b64encode(proxy_auth.encode("utf-8")).decode("ascii")
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 8080, timeout=30)
    try:
        conn.request(method, f"http://{HOST}{path}", body=body or None, headers=sent)
        response = conn.getresponse()
        if response.status == 407:
            raise CommandError(f"the proxy at {url} asks for credentials (listen.proxyauth): pass "
                               "--proxy-auth USER:PASSWORD" if not proxy_auth else
                               f"the proxy at {url} refused the credentials given (407)")
        return response.status, response.read()
    except OSError as e:
        raise CommandError(f"cannot reach the proxy at {url}: {e}") from None
    finally:
        conn.close()


def _gone(url: str, state_dir: str) -> str:
    """What to say when the state dir names a proxy that no longer listens (a kill -9 or a
    crash leaves its proxy-url behind)."""
    return (f"the proxy that last ran with state dir {state_dir} ({url}) is not running: "
            f"it stopped without cleaning up (killed or crashed)")


def running_url(state_dir: str) -> str:
    url = read_url(state_dir)
    if not url:
        raise CommandError(f"no proxy is running with state dir {state_dir} (pass --state-dir D)")
    if not _listening(url):
        raise CommandError(_gone(url, state_dir))
    return url


def sites_command(state_dir: str, action: str, site: str | None, for_s: float | None,
                  out: IO[str], proxy_auth: str | None = None) -> int:
    url = running_url(state_dir)
    if action == "list":
        status, body = _proxy_request(url, "GET", "/api/sites", proxy_auth=proxy_auth)
        if status != 200:
            raise CommandError(f"the proxy answered {status} to /api/sites")
        out.write(sites_table(json.loads(body)))
        return 0
    if not site:
        raise CommandError(f"sites {action} needs a SITE (host:port, or host for every port)", 2)
    token = read_token(state_dir)
    if token is None:
        raise CommandError(f"cannot read the operator token in {state_dir} (only the proxy's owner can)")
    payload: dict[str, Any] = {"action": action, "site": site}
    if for_s is not None:
        payload["for_s"] = for_s
    status, body = _proxy_request(url, "POST", ROUTE, json.dumps(payload).encode(), {
        "Content-Type": "application/json", CLIENT_HEADER: "1", TOKEN_HEADER: token}, proxy_auth)
    try:
        answer = json.loads(body)
    except ValueError:
        answer = {"error": body.decode(errors="replace").strip()}
    if status != 200:
        raise CommandError(f"the proxy refused: {answer.get('error', status)}")
    out.write(answer.get("reason", "") + "\n")
    return 0


def sites_table(snapshot: Mapping[str, Any]) -> str:
    """`sites list`: one line per site, the same words as the dashboard."""
    rows = [("site", "requests", "health", "rate", "pause")]
    for entry in snapshot.get("sites", []):
        live = entry.get("live", {})
        health = live.get("health") if isinstance(live.get("health"), Mapping) else {}
        score = health.get("score")
        shown = f"{score:.0f} {health.get('band', '')}" if isinstance(score, (int, float)) else "–"
        rate = live.get("rate", entry.get("last_rate"))
        rows.append((str(entry.get("site", "")), str(entry.get("requests", 0)), shown,
                     f"{rate:g}/s" if isinstance(rate, (int, float)) else "–", pause_words(live)))
    if len(rows) == 1:
        return "no sites yet\n"
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "".join("  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4] + "\n"
                   for r in rows)


# -- wrap -----------------------------------------------------------------------------------------

@contextlib.contextmanager
def wrap_state_dir(given: str | None, keep: bool, configured: str) -> Iterator[tuple[str, bool]]:
    """(state dir, kept): --state-dir or --keep-state reuse one; otherwise a fresh temporary one."""
    if given or keep:
        path = os.path.abspath(os.path.expanduser(given or configured))
        os.makedirs(path, mode=0o700, exist_ok=True)
        yield path, True
        return
    path = tempfile.mkdtemp(prefix="etiquette-wrap-")
    try:
        yield path, False
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _listening(url: str) -> bool:
    """Something accepts connections at `url` (a proxy-url left by a kill -9 points nowhere)."""
    import socket

    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 8080), timeout=2):
            return True
    except OSError:
        return False


def _exit_code(returncode: int) -> int:
    """The child's code; killed by signal N -> 128 + N, as a shell reports it."""
    return 128 - returncode if returncode < 0 else returncode


def wrap_command(cmd: Sequence[str], run_args: Sequence[str], state_dir: str, kept: bool,
                 audit_log: str | None, report: str, err: IO[str], gate: Gate | None = None) -> int:
    """Start the proxy, run CMD through it, stop the proxy, print the run's report; with a
    `gate`, judge the run: BELOW_GRADE_EXIT when below `--require-grade`, whatever CMD's code
    (a conduct failure is the one thing the gate is there to catch), else CMD's code."""
    if not cmd:
        raise CommandError("nothing to run: etiquette-proxy wrap [run options] -- CMD [ARGS...]", 2)
    if audit_log == "-":
        raise CommandError("--audit-log - is not possible with wrap (the report reads the log); name a file", 2)
    running = read_url(state_dir)
    if kept and running and _listening(running):
        raise CommandError(f"a proxy already runs with state dir {state_dir} ({running}): two proxies on one "
                           'state dir would overwrite each other\'s token; use eval "$(etiquette-proxy env)" '
                           "to go through it, or another --state-dir")
    audit_path = os.path.abspath(os.path.expanduser(audit_log)) if audit_log else os.path.join(
        state_dir, "audit.jsonl")
    offset = os.path.getsize(audit_path) if os.path.exists(audit_path) else 0
    try:
        proxy, url = start_child_proxy(state_dir, run_args, os.path.join(state_dir, "wrap-proxy.log"))
    except ChildProxyError as e:
        raise CommandError(str(e)) from None
    try:
        env = {**os.environ, **client_files(state_dir, url)}
        try:
            child = subprocess.Popen(list(cmd), env=env)
        except OSError as e:
            raise CommandError(f"{cmd[0]}: {e.strerror or e}", 127) from None
        forwarded = list(FORWARDED) + ([] if sys.stdin.isatty() else [signal.SIGINT])
        previous = {sig: signal.signal(sig, lambda s, _f: child.send_signal(s)) for sig in forwarded}
        if sys.stdin.isatty():
            previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal told the tool
        try:
            code = _exit_code(child.wait())
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    finally:
        stop_child_proxy(proxy)
    if report == "none" and gate is None:
        return code
    err.flush()
    if report != "none" and not kept and not audit_log:
        err.write("etiquette-proxy wrap: this run's state dir is temporary (keep it with --keep-state)\n")
    run = Report()
    try:
        run = load_report(audit_path, err=err, offset=offset, show_progress=False)
    except FileNotFoundError:
        run.finish()  # the proxy wrote no line: the tool sent nothing through it
    except OSError as e:
        err.write(f"etiquette-proxy wrap: cannot read {audit_path}: {e.strerror}\n")
        return code or 2
    verdict = publish(run, audit_path, None if report == "none" else err, err, report == "json", gate, "wrap", code)
    if verdict == BELOW_GRADE_EXIT:
        return verdict
    return code or verdict  # a JUnit file that cannot be written is a failure a CI must see
