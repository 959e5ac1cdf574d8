"""Web Bot Auth: HTTP Message Signatures (RFC 9421) on every request the proxy sends (SPEC §9).

The profile is draft-ietf-webbotauth-httpsig-protocol-01's minimum (§5.2): one signature
labelled `sig1` over `("@authority" "signature-agent";key="sig1")` with `created`, `keyid` (the
RFC 7638 JWK SHA-256 thumbprint of the Ed25519 key, RFC 8037 §A.3), `alg`, `expires` and
`tag="web-bot-auth"`, and a `Signature-Agent` Dictionary whose member is the URL of the
operator's key directory (a JWK Set verifiers fetch as is, §5.2.1, §5.5), with no parameters.
Headers the proxy adds that a site bills on (`crawler-exact-price`, `crawler-max-price`) are
covered too (§5.2.4 "Additional Headers"; Cloudflare pay per crawl wants them signed).

The signature base has one shape, so it is formatted directly: `http-message-signatures`
takes many times longer than the Ed25519 step to build the same bytes (benchmarks/signing.py
measures both; libsodium through PyNaCl signs, `cryptography` reads and writes the key files).
tests/core/test_webbotauth.py holds the two to each other byte for byte, and to the draft's
test vector. The key is never put in a message, a repr or an error.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, urlsplit

import http_sf
import nacl.signing
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from etiquette_proxy.clock import wall

LABEL = "sig1"
TAG = "web-bot-auth"
DIRECTORY_TAG = "http-message-signatures-directory"
DIRECTORY_PATH = "/.well-known/http-message-signatures-directory"
DIRECTORY_MEDIA_TYPE = "application/http-message-signatures-directory+json"
MAX_VALIDITY_S = 86400  # the draft: expiry no more than 24 hours
HEADER_NAMES = ("Signature-Agent", "Signature-Input", "Signature")
KEYGEN_HINT = "an Ed25519 private key in PEM, as `etiquette-proxy keygen --out FILE` writes"

# Request headers covered whenever the proxy sends them: a price the site may charge must be
# the crawler's signed word, not something an intermediary could add (SPEC §9).
COVERED_WHEN_SENT = ("crawler-exact-price", "crawler-max-price")

# RFC 3986 authority characters (reg-name, IP literal, port); anything else is never signed.
_AUTHORITY = re.compile(r"^[a-z0-9._~%!$&'()*+,;=:\[\]-]+$")


class KeyFileError(ValueError):
    """The key file cannot be used; the message names the file, never the key."""


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def read_signing_key(path: str) -> ed25519.Ed25519PrivateKey:
    """The Ed25519 private key in `path`, or KeyFileError saying what is wrong with the file."""
    try:
        with open(path, "rb") as f:
            data = f.read(64 * 1024)
    except FileNotFoundError:
        raise KeyFileError(f"{path}: no such file (expected {KEYGEN_HINT})") from None
    except IsADirectoryError:
        raise KeyFileError(f"{path}: is a directory (expected {KEYGEN_HINT})") from None
    except PermissionError:
        raise KeyFileError(f"{path}: cannot be read: permission denied (expected a file this user can read)") from None
    except OSError as e:
        raise KeyFileError(f"{path}: cannot be read: {e.strerror} (expected {KEYGEN_HINT})") from None
    if b"PUBLIC KEY" in data and b"PRIVATE KEY" not in data:
        raise KeyFileError(f"{path}: holds a public key (expected the private key it belongs to)")
    if b"ENCRYPTED" in data:
        raise KeyFileError(f"{path}: is encrypted with a passphrase (expected an unencrypted key, mode 0600)")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        # The library's message may quote the file; ours does not.
        raise KeyFileError(f"{path}: is not a PEM private key (expected {KEYGEN_HINT})") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        kind = type(key).__name__.removeprefix("_").replace("PrivateKey", "") or "another"
        raise KeyFileError(f"{path}: holds a {kind} key (expected an Ed25519 key: Web Bot Auth signs with ed25519)")
    return key


def key_file_warning(path: str) -> str | None:
    """A warning when others than the owner may read the key file (it should be 0600)."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return None
    if mode & 0o077:
        return f"{path}: the Web Bot Auth key is readable by others (mode {mode:04o}); run chmod 600 {path}"
    return None


def public_bytes(key: ed25519.Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def jwk_thumbprint(public: bytes) -> str:
    """RFC 7638 thumbprint of an Ed25519 public key (RFC 8037 §A.3): the Web Bot Auth keyid."""
    canonical = json.dumps({"crv": "Ed25519", "kty": "OKP", "x": b64url(public)}, separators=(",", ":"),
                           sort_keys=True)
    return b64url(hashlib.sha256(canonical.encode("ascii")).digest())


def public_jwk(key: ed25519.Ed25519PrivateKey) -> dict[str, str]:
    """The key's public JWK as a directory lists it, `kid` = thumbprint (draft: MUST)."""
    public = public_bytes(key)
    return {"kty": "OKP", "crv": "Ed25519", "kid": jwk_thumbprint(public), "x": b64url(public), "use": "sig"}


def directory_body(keys: list[ed25519.Ed25519PrivateKey]) -> str:
    """The JWKS served at /.well-known/http-message-signatures-directory, compact."""
    return json.dumps({"keys": [public_jwk(k) for k in keys]}, separators=(",", ":"))


def _https_parts(value: str, noun: str, expected: str) -> tuple[SplitResult, int | None]:
    """`value` split as an https URL with a plain ASCII host; ValueError naming what is wrong."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{value!r} is not an https {noun} {expected}")
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        raise ValueError(f"{value!r} is not a URL {expected}") from None
    if parts.scheme.lower() != "https":
        raise ValueError(f"{value!r} is not https {expected}")
    if not parts.hostname or parts.username or parts.password:
        raise ValueError(f"{value!r} has no plain host {expected}")
    if not parts.hostname.isascii():
        raise ValueError(f"{value!r} is not ASCII (expected the punycode form of the host)")
    return parts, port


def https_origin(value: str) -> str:
    """The ASCII serialisation of an https origin; ValueError otherwise."""
    expected = "(expected an https origin such as https://bot.example, where the key directory is served)"
    parts, port = _https_parts(value, "origin", expected)
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"{value!r} is not an origin: it has a path, query or fragment {expected}")
    host = (parts.hostname or "").lower()
    host = f"[{host}]" if ":" in host else host
    return f"https://{host}" + (f":{port}" if port not in (None, 443) else "")


# RFC 3986 path and query characters, printable ASCII that an sf-string carries unescaped.
_PATH_QUERY = re.compile(r"^[A-Za-z0-9._~%!$&'()*+,;=:@/?-]*$")


def agent_uri(value: str) -> str:
    """A `Signature-Agent` member value as draft-ietf-webbotauth-httpsig-protocol-01 §5.2.1 wants
    it: an absolute https URI (a String Item), sent as given; ValueError otherwise."""
    expected = ("(expected the https URL of your key directory, or an https origin such as "
                "https://bot.example whose /.well-known/http-message-signatures-directory serves it)")
    parts, _ = _https_parts(value, "URL", expected)
    if parts.fragment:
        raise ValueError(f"{value!r} has a fragment {expected}")
    if not _PATH_QUERY.match(parts.path + parts.query):
        raise ValueError(f"{value!r} is not plain ASCII (expected the punycode host and a percent-encoded path)")
    return value.strip()


def directory_url(value: str) -> str:
    """`identity.web_bot_auth.signature_agent` as sent: at -01 verifiers fetch the member value
    itself as the JWK Set (§5.5), so an origin alone, which earlier drafts resolved to its
    well-known directory, is written out as that well-known URL (§4.5, §8.1)."""
    value = agent_uri(value)
    parts = urlsplit(value)
    if parts.path in ("", "/") and not parts.query:
        return https_origin(f"https://{parts.netloc}") + DIRECTORY_PATH
    return value


def directory_authority(url: str) -> str:
    """The authority of a directory URL (what its possession proof covers as `@authority`)."""
    return urlsplit(directory_url(url)).netloc.lower()


def signing_authority(host_header: str, scheme: str) -> str:
    """`@authority` as RFC 9421 §2.2.3 normalises it: lower case, the scheme's default port dropped."""
    authority = host_header.strip().lower()
    if not authority or not _AUTHORITY.match(authority):
        raise ValueError(f"cannot sign for authority {host_header!r}")
    default = ":443" if scheme.lower() == "https" else ":80"
    if authority.endswith(default):
        authority = authority[: -len(default)]
    return authority


def sf_string(value: str) -> str:
    return http_sf.ser((value, {}))


@dataclass(frozen=True)
class Signed:
    """The three fields one request carries; `keyid` for the audit line."""

    headers: tuple[tuple[str, str], ...]
    keyid: str
    created: int
    expires: int


class RequestSigner:
    """Signs requests for one key and one Signature-Agent; holds no flow, only strings."""

    def __init__(self, key: ed25519.Ed25519PrivateKey, signature_agent: str, validity_s: float,
                 clock: Callable[[], float] = wall, label: str = LABEL, agent_key: str | None = None):
        # The draft wants the Signature-Agent member keyed to the signature's label; its test
        # vectors use another key (`agent2` for `sig2`), hence `agent_key`.
        validity = int(validity_s)
        if not 1 <= validity <= MAX_VALIDITY_S:
            raise ValueError(f"validity ({validity_s!r}) must be between 1 s and 24 h")
        self._key = key
        # libsodium (PyNaCl) signs the same deterministic Ed25519 bytes as `cryptography` in
        # ~60 % of the time (benchmarks/signing.py): per request, this is most of signing's cost.
        self._sign = nacl.signing.SigningKey(key.private_bytes_raw()).sign
        self.keyid = jwk_thumbprint(public_bytes(key))
        self.signature_agent = agent_uri(signature_agent)
        self.validity_s = validity
        self._clock = clock
        self.label = label
        self.agent_key = agent_key or label
        self.agent_field = http_sf.ser({self.agent_key: (self.signature_agent, {})})  # sig1="https://…"
        self._covered = f'("@authority" "signature-agent";key={sf_string(self.agent_key)})'
        # RFC 9421 §2.1.2: a Dictionary member's value is its serialisation.
        self._agent_line = f'"signature-agent";key={sf_string(self.agent_key)}: {sf_string(self.signature_agent)}'
        self._keyid_param = f";keyid={sf_string(self.keyid)};alg=\"ed25519\""
        # One signature per authority and second, reused: Ed25519 is deterministic, so a second
        # request in the same second would get the same bytes anyway, for the cost of signing again.
        self._last: dict[str, Signed] = {}

    def __repr__(self) -> str:
        return f"RequestSigner(keyid={self.keyid!r}, signature_agent={self.signature_agent!r})"

    def describe(self) -> dict[str, Any]:
        """What the dashboard shows: never the key."""
        return {"signing": True, "keyid": self.keyid, "signature_agent": self.signature_agent,
                "validity_s": self.validity_s}

    def signature_params(self, created: int, expires: int, nonce: str | None = None,
                         covered: tuple[tuple[str, str], ...] = ()) -> str:
        nonce_param = f";nonce={sf_string(nonce)}" if nonce is not None else ""
        components = self._covered
        if covered:
            components = components[:-1] + "".join(f" {sf_string(name)}" for name, _ in covered) + ")"
        return (f"{components};created={created}{self._keyid_param};expires={expires}"
                f"{nonce_param};tag=\"{TAG}\"")

    def signature_base(self, authority: str, params: str, covered: tuple[tuple[str, str], ...] = ()) -> str:
        """RFC 9421 §2.5 for this shape of covered components (§2.1: a field's value, trimmed)."""
        extra = "".join(f'{sf_string(name)}: {value.strip()}\n' for name, value in covered)
        return f'"@authority": {authority}\n{self._agent_line}\n{extra}"@signature-params": {params}'

    def sign(self, authority: str, created: int | None = None, expires: int | None = None,
             nonce: str | None = None, covered: tuple[tuple[str, str], ...] = ()) -> Signed:
        """The Signature-Agent, Signature-Input and Signature fields for a request to `authority`
        (already normalised: `signing_authority`); `covered`: more header fields signed, as
        (lower-case name, value) pairs (`covered_fields`)."""
        if created is None:
            created = int(self._clock())
        if expires is None:
            expires = created + self.validity_s
        if nonce is None and not covered:
            last = self._last.get(authority)
            if last is not None and last.created == created and last.expires == expires:
                return last
        params = self.signature_params(created, expires, nonce, covered)
        signature = self._sign(self.signature_base(authority, params, covered).encode("ascii")).signature
        value = base64.b64encode(signature).decode("ascii")
        signed = Signed((("Signature-Agent", self.agent_field), ("Signature-Input", f"{self.label}={params}"),
                         ("Signature", f"{self.label}=:{value}:")), self.keyid, created, expires)
        if nonce is None and not covered:
            if len(self._last) >= 4096:
                self._last.clear()
            self._last[authority] = signed
        return signed


def signer_from_config(config: Any) -> RequestSigner | None:
    """The signer `identity.web_bot_auth` asks for, or None; KeyFileError/ValueError if unusable."""
    wba = config.identity.web_bot_auth
    if not wba.key_file:
        return None
    return RequestSigner(read_signing_key(os.path.expanduser(wba.key_file)), wba.signature_agent, wba.validity)


_SIGNATURE_FIELDS = frozenset(n.lower() for n in HEADER_NAMES)


def covered_fields(headers: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The request's fields among COVERED_WHEN_SENT, in that order, as the signature covers
    them; a field sent twice is covered as its values joined (RFC 9421 §2.1), printable ASCII
    only (anything else is never signed: ValueError)."""
    found: dict[str, list[str]] = {}
    for name, value in headers:
        lower = name.lower()
        if lower in COVERED_WHEN_SENT:
            if not value.isascii() or not value.strip().isprintable():
                raise ValueError(f"cannot sign {lower} {value[:40]!r}")
            found.setdefault(lower, []).append(value.strip())
    return tuple((n, ", ".join(found[n])) for n in COVERED_WHEN_SENT if n in found)


def client_signed(header_names: Iterable[str]) -> bool:
    """A request that already carries Signature* fields: the client signs itself (SPEC §9)."""
    return any(name.lower() in _SIGNATURE_FIELDS for name in header_names)


# -- the directory (keygen --directory) --------------------------------------------------------

def content_digest(body: bytes) -> str:
    """RFC 9530 Content-Digest with sha-256."""
    return f"sha-256=:{base64.b64encode(hashlib.sha256(body).digest()).decode('ascii')}:"


def signed_directory(key: ed25519.Ed25519PrivateKey, signature_agent: str, created: int,
                     expires: int) -> tuple[str, list[tuple[str, str]]]:
    """The directory response body and headers, with the possession proof the draft recommends:
    a signature over `("@authority";req "content-digest")`, tag http-message-signatures-directory."""
    body = directory_body([key])
    authority = directory_authority(signature_agent)
    digest = content_digest(body.encode("ascii"))
    keyid = jwk_thumbprint(public_bytes(key))
    params = (f'("@authority";req "content-digest");created={created};expires={expires}'
              f";keyid={sf_string(keyid)};tag=\"{DIRECTORY_TAG}\"")
    base = f'"@authority";req: {authority}\n"content-digest": {digest}\n"@signature-params": {params}'
    signature = base64.b64encode(key.sign(base.encode("ascii"))).decode("ascii")
    headers = [("Content-Type", DIRECTORY_MEDIA_TYPE), ("Cache-Control", "max-age=86400"),
               ("Content-Digest", digest), ("Signature-Input", f"binding={params}"),
               ("Signature", f"binding=:{signature}:")]
    return body, headers


def write_new_key(path: str) -> ed25519.Ed25519PrivateKey:
    """A new Ed25519 key in `path` (PEM, mode 0600); never overwrites an existing file."""
    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.write(fd, pem)
        os.fsync(fd)
    finally:
        os.close(fd)
    return key
