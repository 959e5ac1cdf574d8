"""The environment `wrap` and `env` give clients (SPEC §3)."""

from __future__ import annotations

import shlex
import subprocess

from etiquette_proxy.operate.client_env import client_env, combined_bundle, export_lines, system_bundle, wgetrc_text

URL = "http://127.0.0.1:8123"


def test_every_variable_the_spec_names_and_no_proxy_emptied():
    env = client_env(URL, "/s/ca.pem", "/s/bundle.pem", "/s/wgetrc")
    for key in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        assert env[key] == URL
    assert env["NO_PROXY"] == env["no_proxy"] == ""
    for key in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        assert env[key] == "/s/bundle.pem"  # the proxy CA plus the system roots
    assert env["NODE_EXTRA_CA_CERTS"] == "/s/ca.pem"  # Node adds it to its own roots
    assert env["NODE_USE_ENV_PROXY"] == "1" and env["WGETRC"] == "/s/wgetrc"
    # Perl LWP: every UserAgent reads the proxy variables, and verifies against the bundle
    assert env["PERL_LWP_ENV_PROXY"] == "1"
    assert env["PERL_LWP_SSL_CA_FILE"] == env["HTTPS_CA_FILE"] == "/s/bundle.pem"


def test_export_lines_survive_a_shell(tmp_path):
    env = {"A": "plain", "B": "it's got $pace and `ticks`", "C": ""}
    script = export_lines(env) + 'printf "%s|%s|%s" "$A" "$B" "$C"'
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout
    assert out == "plain|it's got $pace and `ticks`|"
    assert all(line.startswith("export ") for line in export_lines(env).splitlines())
    assert shlex.split(export_lines({"X": "a b"}))[1] == "X=a b"


def test_bundle_has_the_proxy_ca_first_then_the_system_roots(tmp_path):
    system = tmp_path / "roots.pem"
    system.write_text("-----BEGIN CERTIFICATE-----\nROOT\n-----END CERTIFICATE-----\n")
    assert system_bundle({"SSL_CERT_FILE": str(system)}, ()) == str(system)
    assert system_bundle({}, (str(tmp_path / "none"),)) is None
    bundle = combined_bundle("-----BEGIN CERTIFICATE-----\nPROXY\n-----END CERTIFICATE-----", system.read_text())
    assert bundle.index("PROXY") < bundle.index("ROOT") and bundle.count("BEGIN") == 2


def test_wgetrc_names_the_bundle_and_the_proxy():
    text = wgetrc_text(URL, "/s/bundle.pem")
    assert f"https_proxy = {URL}" in text and "ca_certificate = /s/bundle.pem" in text and "use_proxy = on" in text
