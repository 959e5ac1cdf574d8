"""The environment that points common HTTP clients at the proxy (SPEC §3 `wrap`, `env`).

Pure: given the proxy's URL and the files written beside its CA, the variables a child process
gets. Each variable is here because a client family reads it (README: "Point your client at it"):

- `http_proxy`/`https_proxy` lower case: curl reads only these for http:// (upper-case
  `HTTP_PROXY` is ignored by curl for CGI safety, httpoxy); wget reads only lower case.
- `HTTP_PROXY`/`HTTPS_PROXY`: Python (requests, httpx, urllib, aiohttp with trust_env), Go,
  Node's `NODE_USE_ENV_PROXY=1` (Node >= 24) and most others.
- `ALL_PROXY`/`all_proxy`: curl's fallback for schemes without their own variable.
- `NO_PROXY`/`no_proxy` emptied: an inherited `localhost,127.0.0.1,.corp` would send those
  hosts around the proxy, unseen and unlogged.
- CA trust: a bundle of the proxy's CA *and* the system's roots (`SSL_CERT_FILE` replaces
  OpenSSL's store, so the proxy CA alone would break any TLS the child makes elsewhere);
  `NODE_EXTRA_CA_CERTS` adds to Node's own roots, so it gets the proxy CA alone.
- `WGETRC`: Debian's wget uses GnuTLS and ignores `SSL_CERT_FILE`; a wgetrc with
  `ca_certificate` is the only way without a flag.
- Perl LWP: `PERL_LWP_ENV_PROXY=1` makes every `LWP::UserAgent->new` read the proxy variables
  (otherwise only scripts that call `env_proxy` do); LWP::Protocol::https verifies with
  IO::Socket::SSL against Mozilla::CA's bundle unless `PERL_LWP_SSL_CA_FILE` (or the older
  `HTTPS_CA_FILE`) names another, so both name the combined bundle.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping

PROXY_VARS = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "all_proxy")
NO_PROXY_VARS = ("NO_PROXY", "no_proxy")
BUNDLE_VARS = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO")
PERL_CA_VARS = ("PERL_LWP_SSL_CA_FILE", "HTTPS_CA_FILE")

# Where Debian, Fedora/RHEL, Alpine/openSUSE and macOS (Homebrew openssl) keep their roots.
SYSTEM_BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
)

BUNDLE_NAME = "client-ca-bundle.pem"
WGETRC_NAME = "wgetrc"


def client_env(proxy_url: str, ca_cert: str, bundle: str, wgetrc: str) -> dict[str, str]:
    """Every variable a child needs to use the proxy at `proxy_url` and trust its CA."""
    env = dict.fromkeys(PROXY_VARS, proxy_url)
    env.update(dict.fromkeys(NO_PROXY_VARS, ""))
    env.update(dict.fromkeys(BUNDLE_VARS, bundle))
    env["NODE_EXTRA_CA_CERTS"] = ca_cert
    env["NODE_USE_ENV_PROXY"] = "1"  # Node >= 24: fetch/http honour HTTP(S)_PROXY only with this
    env["WGETRC"] = wgetrc
    env.update(dict.fromkeys(PERL_CA_VARS, bundle))
    env["PERL_LWP_ENV_PROXY"] = "1"
    return env


def export_lines(env: Mapping[str, str]) -> str:
    """`export K='v'` lines a POSIX shell can `eval`."""
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())


def wgetrc_text(proxy_url: str, bundle: str) -> str:
    """wget's settings: its own proxy switches and the CA bundle (GnuTLS ignores SSL_CERT_FILE)."""
    return (
        "# written by etiquette-proxy: wget through the proxy, trusting its CA\n"
        "use_proxy = on\n"
        f"http_proxy = {proxy_url}\n"
        f"https_proxy = {proxy_url}\n"
        "no_proxy = \n"
        f"ca_certificate = {bundle}\n"
    )


def system_bundle(environ: Mapping[str, str], candidates: tuple[str, ...] = SYSTEM_BUNDLES) -> str | None:
    """The roots the child would have trusted without us: its SSL_CERT_FILE, else the OS's."""
    for path in (environ.get("SSL_CERT_FILE", ""), *candidates):
        if path and os.path.isfile(path):
            return path
    return None


def combined_bundle(proxy_ca_pem: str, system_pem: str) -> str:
    """The proxy's CA first, then the system roots: trusted by one `SSL_CERT_FILE`."""
    parts = [proxy_ca_pem.strip() + "\n"]
    if system_pem.strip():
        parts.append(system_pem.strip() + "\n")
    return "".join(parts)
