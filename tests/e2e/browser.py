"""Headless Chromium (Debian's package) pointed at the proxy, for the dashboard tests.

Only http://etiquette.proxy/ goes to the proxy under test; every other URL Chromium asks for
by itself (time sync, component updates) goes to a closed loopback port through a PAC script.
With a plain --proxy-server those background requests reached the proxy, which then tried to
fetch robots.txt from Google: off loopback, and noise in the scenario's figures.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path

import pytest

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars")


def chromium() -> str:
    """The browser binary; a missing one fails the test loudly (./run-tests installs it as root)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.fail("chromium is not installed: the dashboard must be tested in a real browser "
                    "(apt-get install -y chromium; ./run-tests does this as root)", pytrace=False)
    return found


def pac_for(proxy_port: int, host: str = "etiquette.proxy") -> str:
    script = (f'function FindProxyForURL(url, host) {{ if (host == "{host}") '
              f'return "PROXY 127.0.0.1:{proxy_port}"; return "PROXY 127.0.0.1:9"; }}')
    return "data:application/x-ns-proxy-autoconfig;base64," + base64.b64encode(script.encode()).decode()


def run_chromium(proxy_port: int, profile: Path, url: str, *args: str,
                 timeout: float = 60) -> subprocess.CompletedProcess[str]:
    profile.mkdir(parents=True, exist_ok=True)  # a new, empty profile per run
    cmd = [chromium(), *FLAGS, f"--user-data-dir={profile}", f"--proxy-pac-url={pac_for(proxy_port)}", *args, url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def dump_dom(proxy_port: int, profile: Path, url: str = "http://etiquette.proxy/") -> str:
    """The page as Chromium rendered it (after parsing, scripts and layout)."""
    done = run_chromium(proxy_port, profile, url, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def screenshot(proxy_port: int, profile: Path, out: Path, url: str = "http://etiquette.proxy/",
               size: str = "1400,800") -> Path:
    done = run_chromium(proxy_port, profile, url, f"--screenshot={out}", f"--window-size={size}")
    assert done.returncode == 0 and out.exists(), done.stderr[-2000:]
    return out


_MEASURE = """<script>
const rows = [...document.querySelectorAll('tr[data-site]')].map(r => {
  const b = r.getBoundingClientRect(); return [r.dataset.site, b.top, b.bottom]; });
const out = document.createElement('pre'); out.id = 'layout';
out.textContent = JSON.stringify({height: innerHeight, width: innerWidth,
  scrollWidth: document.documentElement.scrollWidth, rows});
document.body.appendChild(out);
</script>"""


def layout(page_html: str, work: Path, size: str = "1400,900") -> dict:
    """Where Chromium lays out each site row of a dashboard page: {height, width, rows: [[site,
    top, bottom]]}. The page is measured as served, plus a measuring script added at the end."""
    import json

    work.mkdir(parents=True, exist_ok=True)
    page = work / "page.html"
    page.write_text(page_html.replace("</body>", _MEASURE + "</body>"))
    done = run_chromium(9, work / "profile", page.as_uri(), "--dump-dom", f"--window-size={size}")
    assert done.returncode == 0, done.stderr[-2000:]
    text = done.stdout.split('<pre id="layout">', 1)[1].split("</pre>", 1)[0]
    return json.loads(text.replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))
