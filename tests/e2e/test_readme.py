"""The README's commands, run as written in a fresh clone (issue 16: they must work).

What is run: every command of the README's first screen (before the first `---`) except
`./run-tests` (this suite) and the bare `./run-proxy` (started here with a free port), then the
curl and wget lines of "Point your client at it". What is changed, and only that: the ports
8080 (the proxy) and 8000 (the local site) become free ones, `/tmp/mirror` a temporary
directory, and HOME a temporary one (so `~/.local/state/etiquette-proxy` is this test's). The
clone gets its own venv with the clone installed in it (dependencies borrowed from this venv,
so no download: the suite must not depend on the network).
"""

from __future__ import annotations

import re
import shlex
import site as pysite
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.proxy import clean_env
from tests.e2e.sites import Answer, Site

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def first_screen_commands(readme: str) -> list[str]:
    top = readme.split("\n---\n", 1)[0]
    return [line[4:] for line in top.splitlines() if line.startswith("    ") and line.strip()]


def client_row(readme: str, client: str) -> str:
    """The backticked command in the "by hand" cell of a client's row."""
    for line in readme.splitlines():
        if line.startswith(f"| {client} |"):
            cell = line.split(" | ")[1]
            return re.fullmatch(r"`(.*)`", cell.strip()).group(1)  # type: ignore[union-attr]
    raise AssertionError(f"no {client} row in the README's client table")


def fresh_clone(tmp: Path) -> Path:
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    clone = tmp / "clone"
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(ROOT), str(clone)], check=True, timeout=120)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", head], check=True, timeout=60)
    venv = clone / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    purelib = subprocess.run([str(venv / "bin/python"), "-c",
                              "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # This venv's packages on the clone's path: a plain directory line (its own .pth files,
    # including this checkout's editable install, are not processed from there). Then the
    # clone installed the way `pip install -e .` would (pyproject.toml: the packages
    # addons/ and etiquette_proxy/), without building a wheel: the suite must not need the network.
    links = venv / "editable"
    links.mkdir()
    (links / "addons").symlink_to(clone / "addons")
    (links / "etiquette_proxy").symlink_to(clone / "etiquette_proxy")
    Path(purelib, "etiquette_clone.pth").write_text(f"{links}\n" + "\n".join(pysite.getsitepackages()) + "\n")
    script = venv / "bin/etiquette-proxy"
    script.write_text(f"#!{venv / 'bin/python'}\nimport sys\nfrom addons.cli import main\n"
                      "sys.exit(main())\n")
    script.chmod(0o755)
    (venv / ".installed-proxy").touch()  # ./run-proxy: installed, do not reinstall from the network
    return clone


def test_readme_commands_work_as_written_in_a_fresh_clone(tmp_path):
    clone = fresh_clone(tmp_path)
    readme = (clone / "README.md").read_text()
    site = Site()
    site.route("/robots.txt", Answer(200, b"User-agent: *\nDisallow: /private/\n"))
    site.route("/", Answer(200, b'<html><a href="/a.html">a</a> <a href="/private/x">x</a></html>',
                           {"Content-Type": "text/html"}))
    home = tmp_path / "home"
    home.mkdir()
    env = clean_env(HOME=str(home))
    proxy = subprocess.Popen([str(clone / "run-proxy"), "--listen-port", "0"], cwd=clone, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proxy.stdout is not None
        ready = proxy.stdout.readline()
        assert ready.startswith("etiquette-proxy listening on http://127.0.0.1:"), ready
        port = ready.strip().rsplit(":", 1)[1]

        def adapt(command: str) -> str:
            return (command.replace("127.0.0.1:8080", f"127.0.0.1:{port}")
                    .replace("127.0.0.1:8000", f"127.0.0.1:{site.port}")
                    .replace("/tmp/mirror", str(tmp_path / "mirror")))

        commands = [c for c in first_screen_commands(readme) if c not in ("./run-proxy", "./run-tests")]
        assert any(c.startswith('eval "$(./run-proxy env)"') for c in commands)
        assert any(c.startswith("./run-proxy wrap -- ") for c in commands)
        script = "set -e\n" + "\n".join(f"echo '>>> {i}'\n{adapt(c)}" for i, c in enumerate(commands))
        done = subprocess.run(["bash", "-c", script], cwd=clone, env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, f"{script}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
        out = done.stdout
        assert "X-Etiquette-Decision: fetched" in out  # curl -i through the env's variables
        assert f"127.0.0.1:{site.port}" in out.split(">>> 2", 1)[1]  # sites list names the site
        assert "grade" in out  # report
        assert (tmp_path / "mirror").exists() and "etiquette-proxy report:" in done.stderr  # wrap
        assert "/private/x" not in site.paths()

        before = len(site.paths())
        for client in ("curl", "wget"):
            line = adapt(client_row(readme, client))
            row = subprocess.run(["bash", "-c", line], cwd=clone, env=env, capture_output=True, text=True,
                                 timeout=60)
            assert row.returncode == 0, f"{line}\n{row.stderr}"
            assert "/a.html" in row.stdout, f"{line}\n{row.stdout}"
        assert site.paths()[before:].count("/") == 2  # both reached the site, through the proxy
        audit = (home / ".local/state/etiquette-proxy/audit.jsonl").read_text()
        agents = re.findall(r'"client_ua":"([^"]*)"', audit)
        assert any(a.startswith("curl/") for a in agents) and any(a.startswith("Wget/") for a in agents)
    finally:
        proxy.terminate()
        try:
            proxy.wait(15)
        except subprocess.TimeoutExpired:
            proxy.kill()
            proxy.wait()
        site.close()
    assert not (home / ".local/state/etiquette-proxy/proxy-url").exists()


def test_readme_extraction_finds_what_it_runs():
    readme = (ROOT / "README.md").read_text()
    commands = first_screen_commands(readme)
    assert commands[0] == "./run-proxy" and "./run-tests" in commands
    assert shlex.split(client_row(readme, "curl"))[0] == "curl"
    assert shlex.split(client_row(readme, "wget"))[0] == "wget"
