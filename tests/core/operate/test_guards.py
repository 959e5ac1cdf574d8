"""SPEC §12 guards in the core: proxyauth, keys not supported yet, the endpoint guard, file modes."""

from __future__ import annotations

import os
import stat

import pytest

from etiquette_proxy.config import ConfigError, load_config
from etiquette_proxy.file_modes import secure_file, secure_tree
from etiquette_proxy.visibility.endpoint_guard import refusal_for

# -- config ---------------------------------------------------------------------------------------

def test_a_proxyauth_password_is_never_echoed():
    with pytest.raises(ConfigError) as e:
        load_config("listen:\n  proxyauth: 'crawler:s3cret'\n", "f.yaml")
    assert "s3cret" not in str(e.value)


def test_good_values():
    c = load_config("listen:\n  proxyauth: 'crawler:a-long-password'\n  header_timeout: 2s\n"
                    "upstream:\n  read_timeout: 500ms\n  idle_timeout: 10s\n  max_connections: 8\n"
                    "state:\n  backend: diskcache\n", "f.yaml")
    assert c.listen.proxyauth == "crawler:a-long-password"
    assert (c.listen.header_timeout, c.listen.idle_timeout) == (2.0, 300.0)
    assert (c.upstream.read_timeout, c.upstream.idle_timeout, c.upstream.max_connections) == (0.5, 10.0, 8)


# -- the endpoint guard -----------------------------------------------------------------------------

CLIENT = {"content-type": "application/json", "x-etiquette-client": "1"}


@pytest.mark.parametrize("method,headers,status,words", [
    ("POST", {"content-type": "text/plain"}, 415, "Content-Type: application/json (got text/plain)"),
    ("POST", {"content-type": "application/x-www-form-urlencoded", "x-etiquette-client": "1"}, 415, "got"),
    ("POST", {}, 415, "(got none)"),
    ("POST", {"content-type": "application/json"}, 403, "X-Etiquette-Client: 1"),
    ("POST", {"content-type": "application/json", "x-etiquette-client": "yes"}, 403, "X-Etiquette-Client"),
    ("OPTIONS", {"access-control-request-method": "POST", "origin": "https://evil.example"}, 403, "no CORS preflight"),
])
def test_forgeable_requests_are_refused(method, headers, status, words):
    refusal = refusal_for(method, headers)
    assert refusal is not None and refusal.status == status and words in refusal.text


@pytest.mark.parametrize("method,headers", [
    ("POST", CLIENT), ("POST", {**CLIENT, "content-type": "application/json; charset=utf-8"}),
    ("GET", {}), ("head", {}),
])
def test_what_passes(method, headers):
    assert refusal_for(method, headers) is None


# -- file modes -------------------------------------------------------------------------------------

def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_secure_tree_fixes_an_existing_open_tree_but_leaves_the_ca_certificate(tmp_path):
    state = tmp_path / "state"
    (state / "store" / "ab").mkdir(parents=True)
    for p in (state, state / "store", state / "store" / "ab"):
        p.chmod(0o755)
    files = [state / "audit.jsonl", state / "store" / "cache.db", state / "store" / "ab" / "body.val"]
    for f in files:
        f.write_bytes(b"x")
        f.chmod(0o644)
    cert = state / "mitmproxy-ca-cert.pem"
    cert.write_bytes(b"cert")
    cert.chmod(0o644)
    os.symlink("/etc/hostname", state / "link")
    assert secure_tree(str(state)) == 6
    assert [mode(p) for p in (state, state / "store", state / "store" / "ab")] == [0o700] * 3
    assert [mode(f) for f in files] == [0o600] * 3
    assert mode(cert) == 0o644
    assert secure_tree(str(state)) == 0  # nothing left to change


def test_secure_file(tmp_path):
    f = tmp_path / "audit.jsonl"
    f.write_text("")
    f.chmod(0o644)
    assert secure_file(str(f)) == 1 and mode(f) == 0o600
    assert secure_file(str(tmp_path / "missing")) == 0
