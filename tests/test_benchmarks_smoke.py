"""The benchmark scripts still run against the current core (tiny sizes; no timing asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_decisions_benchmark_runs_at_tiny_size() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "decisions.py"), "--iterations", "200", "--store-urls", "20",
         "--max-seconds", "2"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "whole decision" in proc.stdout
    assert "per-request core decision" in proc.stdout
    # the paused measure (benchmarks/README.md "At b98f75c"): every component, and the holes
    assert "holes: this vCPU was away" in proc.stdout
    paused = proc.stdout.split("split by whether the pause had a hole:")[1].split("(sum of the paused medians")[0]
    for component in ("robots", "budget", "store", "runaway", "health", "audit"):
        assert f"  {component} " in paused


def test_recent_cache_benchmark_runs_at_tiny_size() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "recent_cache.py"), "--puts", "1000"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "limit   4096: Recent (OrderedDict)" in proc.stdout


def test_signing_benchmark_runs_at_tiny_size() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "signing.py"), "--requests", "10", "--rounds", "1"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Web Bot Auth signature, fresh" in proc.stdout
    assert "signing + chaining < 60 µs per request" in proc.stdout


def test_held_benchmark_runs_at_tiny_size() -> None:
    # 30 requests held for one site through the real proxy: all answered, none lost.
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "held.py"), "--quick", "--scenario", "one", "--n", "30"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "answers: {200: 30} of 30" in proc.stdout
    assert "at the site: 30 requests; 0 of them answered non-200" in proc.stdout


def test_layout_figures_name_the_largest_units_and_the_addon_share() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "layout_figures.py"), "--top", "1"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "addon layer / core: lines" in proc.stdout
    assert "class by lines" in proc.stdout and "etiquette_proxy/" in proc.stdout and "addons/" in proc.stdout


def test_fetched_path_benchmark_runs_at_tiny_size() -> None:
    # --before this very checkout: the other-checkout loader is exercised too.
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "fetched_path.py"), "--before", str(ROOT), "--rounds", "1",
         "--n", "20"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "fingerprint 60 KiB HTML page" in proc.stdout and "after/before" in proc.stdout
    assert "get_record gone, absent" in proc.stdout


def test_before_arm_imports_the_other_checkouts_own_packages(tmp_path: Path) -> None:
    # overhead.py --before DIR: DIR is a plain checkout (addons/, etiquette_proxy/), as
    # `git worktree add` makes it. Both packages must come from DIR, never this checkout's
    # editable install (a mixed proxy failed to start once the two disagreed).
    other = tmp_path / "other"
    for pkg in ("addons", "etiquette_proxy"):
        (other / pkg).mkdir(parents=True)
    (other / "addons" / "__init__.py").write_text("")
    (other / "addons" / "cli.py").write_text("WHO = 'other addons'\n")
    (other / "etiquette_proxy" / "__init__.py").write_text("")
    (other / "etiquette_proxy" / "config.py").write_text("WHO = 'other core'\n")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from _harness import checkout_path, clean_env
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    path = checkout_path(other, tmp_path / "shim")
    proc = subprocess.run(
        [sys.executable, "-c",
         "import addons.cli as a, etiquette_proxy.config as c; print(a.WHO, '|', c.WHO)"],
        capture_output=True, text=True, timeout=60, env=clean_env(path), cwd=tmp_path,
    )
    assert proc.stdout.strip() == "other addons | other core", proc.stderr
    (other / "etiquette_proxy" / "config.py").unlink()  # not a checkout of this project any more
    with pytest.raises(SystemExit, match="config.py"):
        checkout_path(other, tmp_path / "shim2")


def test_chain_cost_before_arm_runs_a_plain_checkout() -> None:
    # chain_cost.py --before DIR with this checkout as DIR: both arms start and report every
    # member (the arm imports DIR's addons/ and etiquette_proxy/ through the linked folder).
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "chain_cost.py"), "--before", str(ROOT), "--rounds", "1",
         "--requests", "100"],
        capture_output=True, text=True, timeout=180, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "before round 1" in proc.stdout and "after round 1" in proc.stdout
    assert "AuditWriter" in proc.stdout and "all hooks" in proc.stdout


def test_line_cost_benchmark_runs_at_tiny_size() -> None:
    # The audit lane's per-response hooks in-process; it checks every flow wrote its line.
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "line_cost.py"), "--flows", "50", "--rounds", "1"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "CPU µs per flow, 200 pages with validators: median" in proc.stdout


def test_state_check_benchmark_runs_at_tiny_size() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "state_check.py"), "--log-mb", "1", "--rows", "100", "--runs", "1"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "rebuild_from_log (empty store)" in proc.stdout and "damage()" in proc.stdout


def test_the_lean_floor_imports_no_code_of_ours_and_forwards_a_request() -> None:
    """overhead.py's (b') is mitmproxy alone: its script imports neither `addons` nor
    `etiquette_proxy`, and a request through it reaches the bench site."""
    import ast

    tree = ast.parse((ROOT / "benchmarks" / "_lean_master.py").read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not imported & {"addons", "etiquette_proxy"}, imported
    assert "mitmproxy" in imported
    probe = (
        "import sys, tempfile, urllib.request; from pathlib import Path; sys.path.insert(0, 'benchmarks')\n"
        "from _harness import start_lean, start_site, started\n"
        "with tempfile.TemporaryDirectory() as tmp:\n"
        "    site = start_site(); lean = start_lean(Path(tmp) / 'lean')\n"
        "    with started(site, lean):\n"
        "        opener = urllib.request.build_opener(urllib.request.ProxyHandler({'http': lean.url}))\n"
        "        body = opener.open(site.url + '/page/1', timeout=30).read()\n"
        "    print(len(body))\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=150, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "1024"


def test_learn_limits_benchmark_runs_at_tiny_size() -> None:
    # one kind of site for 3 s through the real proxy: the table's row is printed
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "learn_limits.py"), "--seconds", "3", "--kinds", "announcing"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "| announcing | " in proc.stdout and "command:" in proc.stdout
