"""Identity and accountability end to end (SPEC §9, §11): every request the site receives is
signed and verifies with an independent verifier; bad keys stop start-up; `verify-log` holds
across a restart and a kill -9 and names a changed, removed or inserted line."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.proxy import ETIQUETTE, FAST_PACING, clean_env
from tests.e2e.sites import Answer, Arrival, Site

TESTS = Path(__file__).resolve().parents[1]
VERIFIER = TESTS / "e2e" / "verify_signatures.mjs"
AGENT = "https://crawler.example"


def etiquette(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ETIQUETTE, *args], capture_output=True, text=True, env=clean_env(), timeout=timeout)


def keygen(path: Path) -> dict:
    out = etiquette("keygen", "--out", str(path))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def verify_with_node(directory: dict, arrivals: list[Arrival], required: tuple[str, ...] = ()) -> list[dict]:
    """What npm http-message-sig + Node's Ed25519 say of each request the site received;
    `required`: header fields every signature must also cover."""
    requests_ = [{"method": a.method, "target_uri": f"http://{a.headers['host']}{a.path}",
                  "fields": list(a.headers.items())} for a in arrivals]
    given = {"directory": directory, "requests": requests_, "required": list(required)}
    out = subprocess.run(["node", str(VERIFIER)], input=json.dumps(given),
                         capture_output=True, text=True, timeout=60, cwd=TESTS, check=False)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def signing_sets(key: Path) -> list[str]:
    return [f"identity.web_bot_auth.key_file={key}", f"identity.web_bot_auth.signature_agent={AGENT}"]


def test_every_request_the_site_receives_is_signed_and_verifies_independently(start_proxy, site, tmp_path):
    key = tmp_path / "bot.pem"
    directory = keygen(key)
    keyid = directory["keys"][0]["kid"]
    site.route("/robots.txt", Answer(200, b"User-agent: *\nDisallow: /private\n", {"Content-Type": "text/plain"}))
    site.route("/canary", Answer(200, b"<html>canary-ok</html>", {"Content-Type": "text/html"}))
    site.route("/etag", Answer(200, b"<html>v1</html>", {"Content-Type": "text/html", "ETag": '"v1"'}))
    canaries = f"health.canaries=[{{url: '{site.url('/canary')}', marker: canary-ok}}]"
    # ai-train declared: the TDMRep tdmrep.json side fetch is signed like robots.txt (SPEC §9)
    proxy = start_proxy(sets=FAST_PACING + signing_sets(key) + [canaries, "purposes=[ai-train]"])

    with proxy.session() as s:
        assert s.get(site.url("/a"), timeout=30).status_code == 200
        assert s.get(site.url("/etag"), timeout=30).status_code == 200
        assert s.get(site.url("/etag"), timeout=30).status_code == 200  # revalidated: validators injected
        assert s.get(site.url("/private/x"), timeout=30).status_code == 403  # never leaves
        own = {"Signature-Input": 'own=("@authority");created=1', "Signature": "own=:AAAA:",
               "Signature-Agent": 'own="https://client.example"'}
        assert s.get(site.url("/own"), headers=own, timeout=30).status_code == 200
    status, _, _ = proxy.curl(site.url("/c?q=1"))
    assert status == 200
    deadline = time.monotonic() + 30
    while not site.hits("/canary") and time.monotonic() < deadline:
        time.sleep(0.1)

    arrivals = [a for a in site.arrivals if a.path != "/own"]
    paths = [a.path for a in arrivals]
    assert "/robots.txt" in paths and "/canary" in paths and "/c?q=1" in paths
    assert paths.count("/.well-known/tdmrep.json") == 1
    assert "/private/x" not in paths
    assert any("if-none-match" in a.headers for a in site.hits("/etag"))  # signed after the validators
    results = verify_with_node(directory, arrivals)
    assert [r["ok"] for r in results] == [True] * len(arrivals), list(zip(paths, results, strict=True))
    assert {r["keyid"] for r in results} == {keyid}
    assert {r["tag"] for r in results} == {"web-bot-auth"}
    for a, r in zip(arrivals, results, strict=True):
        # draft-ietf-webbotauth-httpsig-protocol-01 §5.5: the member is the directory's URL itself
        assert a.headers["signature-agent"] == f'sig1="{AGENT}/.well-known/http-message-signatures-directory"'
        assert a.headers["signature-input"].startswith('sig1=("@authority" "signature-agent";key="sig1");created=')
        assert 0 < r["expires"] - r["created"] <= 300

    # The verifier does verify: the same headers presented to another authority fail.
    moved = Arrival(arrivals[0].method, arrivals[0].path, {**arrivals[0].headers, "host": "elsewhere.example"}, 0)
    assert verify_with_node(directory, [moved])[0]["ok"] is False

    # The client's own signature reached the site untouched, and the audit line says so.
    own_hit = site.hits("/own")[0].headers
    assert (own_hit["signature-input"], own_hit["signature"], own_hit["signature-agent"]) == (
        own["Signature-Input"], own["Signature"], own["Signature-Agent"])
    lines = proxy.wait_audit(lambda r: r["url"].endswith("/own"))
    assert lines and "signed" not in lines[0] and "did not sign" in lines[0]["not_signed"]
    signed_lines = [r for r in proxy.audit() if r.get("upstream_status") is not None and "/own" not in r["url"]]
    assert signed_lines and {r.get("signed") for r in signed_lines} == {keyid}
    assert any(r.get("robots_fetch") for r in signed_lines) and any(r.get("canary") for r in signed_lines)

    with proxy.session() as s:
        api = s.get("http://etiquette.proxy/api/sites", timeout=30).json()
    assert api["identity"]["signing"] is True and api["identity"]["keyid"] == keyid

    secret = "".join(key.read_text().splitlines()[1:-1])
    proxy.stop()
    for text in (proxy.stderr(), proxy.audit_path.read_text(), json.dumps(api)):
        assert secret not in text


@pytest.mark.parametrize("case", ["missing", "ec-key", "not-https"])
def test_a_bad_key_or_signature_agent_stops_start_up_naming_it(tmp_path, case):
    key = tmp_path / "bot.pem"
    agent = AGENT
    if case == "ec-key":
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        key.write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    elif case == "not-https":
        keygen(key)
        agent = "http://crawler.example/keys"
    out = etiquette("run", "--listen-port", "0", "--state-dir", str(tmp_path / "s"),
                    "--set", f"identity.web_bot_auth.key_file={key}",
                    "--set", f"identity.web_bot_auth.signature_agent={agent}", timeout=30)
    assert out.returncode == 2 and "listening" not in out.stdout
    expected = {
        "missing": f"--set:1: identity.web_bot_auth.key_file: {key}: no such file",
        "ec-key": f"--set:1: identity.web_bot_auth.key_file: {key}: holds a",
        "not-https": "--set:2: identity.web_bot_auth.signature_agent: 'http://crawler.example/keys' is not https",
    }[case]
    assert expected in out.stderr


def test_a_key_readable_by_others_is_a_warning_at_start_up(start_proxy, tmp_path):
    key = tmp_path / "bot.pem"
    keygen(key)
    key.chmod(0o644)
    proxy = start_proxy(sets=signing_sets(key))
    proxy.stop()
    assert "readable by others (mode 0644); run chmod 600" in proxy.stderr()
    check = etiquette("check-config", "/dev/null", "--set", f"identity.web_bot_auth.key_file={key}",
                      "--set", f"identity.web_bot_auth.signature_agent={AGENT}")
    assert check.returncode == 0 and "mode 0644" in check.stderr


def verify_log(path: Path) -> subprocess.CompletedProcess[str]:
    return etiquette("verify-log", str(path))


def crawl(proxy, site: Site, tag: str, n: int = 3) -> None:
    with proxy.session() as s:
        for i in range(n):
            assert s.get(site.url(f"/{tag}/{i}"), timeout=30).status_code == 200
    deadline = time.monotonic() + 10  # audit lines are written as decisions happen
    while f"/{tag}/{n - 1}".encode() not in proxy.audit_path.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_verify_log_holds_across_restart_and_kill9_and_names_tampering(start_proxy, site, tmp_path):
    site.route("/robots.txt", Answer(404))
    proxy = start_proxy(sets=FAST_PACING)
    crawl(proxy, site, "one")
    proxy.stop()
    audit = proxy.audit_path
    first = verify_log(audit)
    assert first.returncode == 0 and "chain intact" in first.stdout, first.stdout + first.stderr

    proxy = start_proxy(sets=FAST_PACING)  # the same state dir: the log goes on
    crawl(proxy, site, "two")
    proxy.kill9()
    # A kill -9 in the middle of a write leaves the last line torn: cut it as one would.
    whole = audit.read_bytes()
    audit.write_bytes(whole[: len(whole) - 30])
    proxy = start_proxy(sets=FAST_PACING)
    crawl(proxy, site, "three")
    proxy.stop()
    after = verify_log(audit)
    assert after.returncode == 0, after.stdout
    lines = audit.read_bytes().splitlines(keepends=True)
    torn = next(i for i, line in enumerate(lines, 1) if not line.rstrip(b"\n").endswith(b'"}'))
    assert f"torn line(s) {torn} (proxy killed mid-write; not tampering)" in after.stdout
    report = etiquette("report", str(audit))
    assert "chain intact" in " ".join(report.stdout.split())

    def tampered(name: str, edit) -> subprocess.CompletedProcess[str]:
        copy = tmp_path / f"{name}.jsonl"
        changed = list(lines)
        edit(changed)
        copy.write_bytes(b"".join(changed))
        return verify_log(copy)

    def change(ls: list[bytes]) -> None:
        ls[2] = ls[2].replace(b'"status":200', b'"status":404')

    def delete(ls: list[bytes]) -> None:
        del ls[3]

    def insert(ls: list[bytes]) -> None:
        ls.insert(4, ls[1])

    for name, edit, line, what in (("changed", change, 3, "changed"), ("deleted", delete, 4, "removed before it"),
                                   ("inserted", insert, 5, "inserted")):
        out = tampered(name, edit)
        assert out.returncode == 1, (name, out.stdout)
        assert f"chain broken at line {line}: " in out.stdout and what in out.stdout, (name, out.stdout)


def test_card_is_generated_from_the_config_it_is_given(tmp_path):
    key = tmp_path / "bot.pem"
    keygen(key)
    config = tmp_path / "crawl.yaml"
    config.write_text(
        "identity:\n  user_agent: 'ExampleBot/2.1 (+https://crawler.example/about)'\n"
        "  name: Example Crawler\n  contacts: ['mailto:crawl@crawler.example']\n"
        f"  web_bot_auth:\n    key_file: {key}\n    signature_agent: {AGENT}\n"
        "purposes: [search, train-ai]\ncontent_use: reference\npacing:\n  rate: 2/s\n  burst: 4\n")
    out = etiquette("card", "--config", str(config), "--url", f"{AGENT}/bot")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert json.loads(out.stdout) == {
        "client_id": f"{AGENT}/bot",
        "client_name": "Example Crawler",
        "contacts": ["mailto:crawl@crawler.example"],
        "jwks_uri": f"{AGENT}/.well-known/http-message-signatures-directory",
        "web_bot_auth": {
            "expected-user-agent": "ExampleBot/2.1 (+https://crawler.example/about)",
            "rfc9309-product-token": "ExampleBot",
            "rfc9309-compliance": True,
            "trigger": "crawler",
            "purpose": "search, ai-train",
            "content-use": "reference",
            "rate-control": "429",
            "rate-expectation": "avg=2rps;max=4rps",
        },
    }
    bare = etiquette("card", "--set", "mode=observe")
    assert bare.returncode == 0 and json.loads(bare.stdout)["web_bot_auth"]["rfc9309-compliance"] is False
    assert "no robots.txt product token" in bare.stderr and "no contacts" in bare.stderr
    bad = etiquette("card", "--url", "http://crawler.example/bot")
    assert bad.returncode == 2 and "not an https URL" in bad.stderr
    wrong = etiquette("card", "--set", "identity.contacts=[crawl@crawler.example]")
    assert wrong.returncode == 2 and "identity.contacts: 'crawl@crawler.example' is not a contact URI" in wrong.stderr
