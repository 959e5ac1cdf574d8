"""`./run-tests`, the README's test command, on a machine missing system packages (issue 11)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_missing_packages_are_named_in_one_line_with_the_command_to_install_them(tmp_path):
    # A PATH with only what the script itself runs: no chromium, curl, wget, redis-server, wrk,
    # and no apt-get, so even as root it can only say how to install them.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "python3", "id", "dirname", "env"):
        found = shutil.which(tool)
        assert found, tool
        os.symlink(found, bin_dir / tool)
    out = subprocess.run([str(ROOT / "run-tests"), "--collect-only", "-q", "tests/core/operate/test_guards.py"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={"PATH": str(bin_dir), "HOME": str(tmp_path)})
    said = [line for line in out.stderr.splitlines() if line.startswith("run-tests:")]
    assert len(said) == 1, out.stderr
    for package in ("chromium", "curl", "wget", "redis-server", "wrk"):
        assert package in said[0]
    assert "sudo apt-get install -y" in said[0]
    assert out.returncode == 0, out.stderr  # the tests still run


def test_ci_only_calls_run_tests_in_a_fresh_venv():
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [line.strip() for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert commands[-2:] == ["rm -rf .venv  # always a fresh venv", "./run-tests -q"]
    assert "apt-get" not in ci
