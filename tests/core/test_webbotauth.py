"""Web Bot Auth signing (SPEC §9): the draft's Ed25519 vectors byte for byte, the library as
reference, keys, keyids, origins and key-file errors."""

from __future__ import annotations

import datetime
import os

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from http_message_signatures import HTTPMessageSigner, HTTPSignatureKeyResolver, algorithms

from etiquette_proxy.webbotauth import (
    KeyFileError,
    RequestSigner,
    client_signed,
    content_digest,
    directory_body,
    covered_fields,
    directory_url,
    https_origin,
    jwk_thumbprint,
    key_file_warning,
    public_bytes,
    read_signing_key,
    signed_directory,
    signing_authority,
    write_new_key,
)

# RFC 9421 Appendix B.1.4, test-key-ed25519 (the draft's test vectors use it).
RFC9421_B14 = b"""-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIJ+DYvh6SEqVTm50DFtMDoQikTmiCqirVv9mWG9qfSnF
-----END PRIVATE KEY-----
"""
CREATED, EXPIRES = 1735689600, 4889289600
AGENT = "https://signature-agent.test"

# draft-meunier-webbotauth-httpsig-protocol, "EdDSA Using Curve edwards25519", "Signature-Agent
# Included Present on the Request" (also cloudflare/web-bot-auth web_bot_auth_architecture_v2.json).
VECTOR_NONCE = "n9p433xm+NJ3ph3upfBIGmsuwHw387YV7Q/F+6BSpGCVjYCqQw6rznNA8PVVLySrAWsv0hQtFioQb6E1YsauiA=="
VECTOR_KEYID = "poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U"
VECTOR_PARAMS = ('("@authority" "signature-agent";key="agent2");created=1735689600'
                 f';keyid="{VECTOR_KEYID}";alg="ed25519";expires=4889289600;nonce="{VECTOR_NONCE}"'
                 ';tag="web-bot-auth"')
VECTOR_BASE = ('"@authority": example.com\n'
               '"signature-agent";key="agent2": "https://signature-agent.test"\n'
               f'"@signature-params": {VECTOR_PARAMS}')
VECTOR_HEADERS = (
    ("Signature-Agent", 'agent2="https://signature-agent.test"'),
    ("Signature-Input", f"sig2={VECTOR_PARAMS}"),
    ("Signature", "sig2=:RdNFx5Bj6au3YgAMQL/RzmUlZE8QZLIaXGRpw985hWnwPfMxT228NMk6ehRS1PSl4e8PhbNZACSanGdhEwYCCg==:"),
)


def b14() -> ed25519.Ed25519PrivateKey:
    key = serialization.load_pem_private_key(RFC9421_B14, password=None)
    assert isinstance(key, ed25519.Ed25519PrivateKey)
    return key


def test_the_draft_ed25519_request_vector_byte_for_byte():
    signer = RequestSigner(b14(), AGENT, 300, label="sig2", agent_key="agent2")
    assert signer.keyid == VECTOR_KEYID
    params = signer.signature_params(CREATED, EXPIRES, VECTOR_NONCE)
    assert params == VECTOR_PARAMS
    assert signer.signature_base("example.com", params) == VECTOR_BASE
    signed = signer.sign("example.com", CREATED, EXPIRES, VECTOR_NONCE)
    assert signed.headers == VECTOR_HEADERS


class _Key(HTTPSignatureKeyResolver):
    def __init__(self, key: ed25519.Ed25519PrivateKey):
        self.key = key

    def resolve_private_key(self, key_id: str) -> ed25519.Ed25519PrivateKey:
        return self.key

    def resolve_public_key(self, key_id: str) -> ed25519.Ed25519PublicKey:
        return self.key.public_key()


class _Message:
    def __init__(self, url: str, headers: dict[str, str]):
        self.method, self.url, self.headers = "GET", url, headers


def library_sign(key: ed25519.Ed25519PrivateKey, url: str, agent_field: str, label: str, agent_key: str,
                 created: int, expires: int, nonce: str | None,
                 extra: tuple[tuple[str, str], ...] = ()) -> dict[str, str]:
    """The same request signed by http-message-signatures 3.x (the reference implementation)."""
    message = _Message(url, {"Signature-Agent": agent_field, **dict(extra)})
    at = datetime.datetime.fromtimestamp
    HTTPMessageSigner(signature_algorithm=algorithms.ED25519, key_resolver=_Key(key)).sign(
        message, key_id=jwk_thumbprint(public_bytes(key)), created=at(created, datetime.UTC),
        expires=at(expires, datetime.UTC), nonce=nonce, label=label, tag="web-bot-auth",
        covered_component_ids=("@authority", f'"signature-agent";key="{agent_key}"', *(f'"{n}"' for n, _ in extra)))
    return {k: v for k, v in message.headers.items() if k not in dict(extra)}


def test_the_library_reproduces_the_vector_too():
    headers = library_sign(b14(), "https://example.com/path/to/resource", VECTOR_HEADERS[0][1], "sig2", "agent2",
                           CREATED, EXPIRES, VECTOR_NONCE)
    assert (headers["Signature-Input"], headers["Signature"]) == (VECTOR_HEADERS[1][1], VECTOR_HEADERS[2][1])


@pytest.mark.parametrize(("url", "host_header", "nonce"), [
    ("http://127.0.0.1:8123/a?b=c", "127.0.0.1:8123", None),
    ("https://Example.COM/x", "Example.COM:443", None),
    ("http://example.com:80/", "example.com:80", "bm9uY2U="),
    ("http://[::1]:9000/p", "[::1]:9000", None),
    ("https://sub.example.org:8443/q", "sub.example.org:8443", "a+b/c="),
])
def test_every_signature_equals_the_library_s(url, host_header, nonce):
    key = ed25519.Ed25519PrivateKey.generate()
    signer = RequestSigner(key, "https://bot.example", 300)
    scheme = url.split(":", 1)[0]
    created = 1_796_000_000
    ours = dict(signer.sign(signing_authority(host_header, scheme), created, created + 300, nonce).headers)
    theirs = library_sign(key, url, ours["Signature-Agent"], "sig1", "sig1", created, created + 300, nonce)
    assert ours == theirs
    assert ours["Signature-Agent"] == 'sig1="https://bot.example"'
    assert ours["Signature-Input"].startswith('sig1=("@authority" "signature-agent";key="sig1");created=')
    assert ours["Signature-Input"].endswith(';expires=1796000300;tag="web-bot-auth"' if nonce is None
                                            else ';tag="web-bot-auth"')


def test_expires_is_validity_after_created_and_the_clock_decides_created():
    now = [1_800_000_000.7]
    signer = RequestSigner(ed25519.Ed25519PrivateKey.generate(), "https://bot.example", 120, clock=lambda: now[0])
    first = signer.sign("site.example")
    assert (first.created, first.expires) == (1_800_000_000, 1_800_000_120)
    assert signer.sign("site.example") is first  # same second, same bytes: reused
    now[0] += 1
    second = signer.sign("site.example")
    assert second.created == 1_800_000_001 and second.headers != first.headers
    assert signer.sign("other.example").headers[2] != second.headers[2]


@pytest.mark.parametrize("validity", [0, 0.5, 86401])
def test_validity_outside_1s_to_24h_is_refused(validity):
    with pytest.raises(ValueError, match="between 1 s and 24 h"):
        RequestSigner(ed25519.Ed25519PrivateKey.generate(), "https://bot.example", validity)


def test_keyid_is_the_rfc7638_thumbprint():
    # RFC 8037 Appendix A.3: the thumbprint of the RFC 8032 test key.
    x = bytes.fromhex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")
    assert jwk_thumbprint(x) == "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"


@pytest.mark.parametrize(("value", "origin"), [
    ("https://bot.example", "https://bot.example"),
    ("https://Bot.Example/", "https://bot.example"),
    ("https://bot.example:443", "https://bot.example"),
    ("https://bot.example:8443", "https://bot.example:8443"),
])
def test_signature_agent_is_an_https_origin(value, origin):
    assert https_origin(value) == origin


@pytest.mark.parametrize(("value", "why"), [
    ("http://bot.example", "is not https"),
    ("https://bot.example/keys.json", "has a path"),
    ("https://bot.example?x=1", "has a path, query"),
    ("bot.example", "is not https"),
    ("https://user:pw@bot.example", "no plain host"),
    ("", "is not an https origin"),
])
def test_anything_but_an_https_origin_is_refused(value, why):
    with pytest.raises(ValueError, match=why) as e:
        https_origin(value)
    assert "expected an https origin" in str(e.value)


@pytest.mark.parametrize(("host", "scheme", "authority"), [
    ("Example.com", "http", "example.com"), ("example.com:80", "http", "example.com"),
    ("example.com:443", "https", "example.com"), ("example.com:443", "http", "example.com:443"),
    ("[::1]:8080", "http", "[::1]:8080"),
])
def test_authority_is_normalised_as_rfc9421_says(host, scheme, authority):
    assert signing_authority(host, scheme) == authority


@pytest.mark.parametrize("host", ["", "bad host", "x\r\ny", "ünï.example"])
def test_an_authority_that_cannot_be_signed_is_refused(host):
    with pytest.raises(ValueError, match="cannot sign"):
        signing_authority(host, "http")


def test_a_client_signature_is_noticed_by_any_of_the_three_fields():
    assert client_signed(["Host", "signature-input"])
    assert client_signed({"Signature-Agent"})
    assert not client_signed({"User-Agent", "Host"})


# -- key files ---------------------------------------------------------------------------------

def test_keygen_writes_a_0600_key_that_reads_back_and_never_overwrites(tmp_path):
    path = str(tmp_path / "key.pem")
    old = os.umask(0)
    try:
        key = write_new_key(path)
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert key_file_warning(path) is None
    assert public_bytes(read_signing_key(path)) == public_bytes(key)
    with pytest.raises(FileExistsError):
        write_new_key(path)


def _pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def test_key_file_problems_name_the_file_and_never_the_key(tmp_path):
    missing = tmp_path / "nope.pem"
    with pytest.raises(KeyFileError, match=f"{missing}: no such file"):
        read_signing_key(str(missing))
    ec_key = tmp_path / "ec.pem"
    ec_key.write_bytes(_pem(ec.generate_private_key(ec.SECP256R1())))
    with pytest.raises(KeyFileError, match=rf"{ec_key}: holds a \w+ key \(expected an Ed25519 key"):
        read_signing_key(str(ec_key))
    junk = tmp_path / "junk.pem"
    secret = b"-----BEGIN PRIVATE KEY-----\nTOPSECRETdata==\n-----END PRIVATE KEY-----\n"
    junk.write_bytes(secret)
    with pytest.raises(KeyFileError) as e:
        read_signing_key(str(junk))
    assert "is not a PEM private key" in str(e.value) and "TOPSECRET" not in str(e.value)
    public = tmp_path / "pub.pem"
    public.write_bytes(b14().public_key().public_bytes(serialization.Encoding.PEM,
                                                       serialization.PublicFormat.SubjectPublicKeyInfo))
    with pytest.raises(KeyFileError, match="holds a public key"):
        read_signing_key(str(public))
    with pytest.raises(KeyFileError, match="is a directory"):
        read_signing_key(str(tmp_path))


def test_loose_permissions_are_a_warning_naming_the_mode(tmp_path):
    path = tmp_path / "k.pem"
    path.write_bytes(RFC9421_B14)
    path.chmod(0o644)
    warning = key_file_warning(str(path))
    assert warning is not None and "mode 0644" in warning and f"chmod 600 {path}" in warning
    assert read_signing_key(str(path)) is not None  # a warning, not a refusal


def test_the_signer_never_shows_its_key():
    signer = RequestSigner(b14(), AGENT, 300)
    raw = b14().private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                              serialization.NoEncryption())
    shown = repr(signer) + str(signer.describe())
    assert VECTOR_KEYID in shown
    for secret in (raw.hex(), "n4Ni-HpISpVObnQMW0wOhCKROaIKqKtW", "MC4CAQAwBQYDK2Vw"):
        assert secret not in shown


# -- the directory -----------------------------------------------------------------------------

# The draft's "Signed Directory Response" vector.
DIRECTORY_BODY = ('{"keys":[{"kty":"OKP","crv":"Ed25519","kid":"poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U",'
                  '"x":"JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs","use":"sig"}]}')


def test_the_draft_signed_directory_vector_byte_for_byte():
    body, headers = signed_directory(b14(), AGENT, CREATED, EXPIRES)
    assert body == directory_body([b14()]) == DIRECTORY_BODY
    fields = dict(headers)
    assert fields["Content-Type"] == "application/http-message-signatures-directory+json"
    digest = "sha-256=:CADMT2aBdV/rqQr/NIru64ERQkCobVvllA4V0fLFDu0=:"
    assert fields["Content-Digest"] == content_digest(body.encode()) == digest
    assert fields["Signature-Input"] == (
        'binding=("@authority";req "content-digest");created=1735689600;expires=4889289600'
        f';keyid="{VECTOR_KEYID}";tag="http-message-signatures-directory"')
    assert fields["Signature"] == ("binding=:l6P8R67tm3kujAxbHWio7ll01qrEZ0dKD/WWlGhNYEmTnFZM8Wt0VQ9zqGfvo7T/"
                                   "UMkBxsigzChM1Gpz7gOVBg==:")


# -- config (identity.web_bot_auth) ------------------------------------------------------------

def test_config_errors_name_file_line_key_and_the_key_file(tmp_path):
    from etiquette_proxy.config import ConfigError, load_config

    ec_key = tmp_path / "ec.pem"
    ec_key.write_bytes(_pem(ec.generate_private_key(ec.SECP256R1())))
    text = ("identity:\n  web_bot_auth:\n"
            f"    key_file: {tmp_path / 'missing.pem'}\n"
            "    signature_agent: http://bot.example/keys\n"
            "    validity: 2d\n")
    with pytest.raises(ConfigError) as e:
        load_config(text, "c.yaml")
    assert str(e.value).splitlines() == [
        f"c.yaml:3: identity.web_bot_auth.key_file: {tmp_path / 'missing.pem'}: no such file "
        "(expected an Ed25519 private key in PEM, as `etiquette-proxy keygen --out FILE` writes)",
        "c.yaml:4: identity.web_bot_auth.signature_agent: 'http://bot.example/keys' is not https "
        "(expected the https URL of your key directory, or an https origin such as https://bot.example "
        "whose /.well-known/http-message-signatures-directory serves it)",
        "c.yaml:5: identity.web_bot_auth.validity: '2d' is above the maximum (expected at most 24h)",
    ]
    with pytest.raises(ConfigError, match=r"c.yaml:1: identity.web_bot_auth.key_file: .*holds a \w+ key"):
        load_config(f"identity.web_bot_auth.key_file: {ec_key}\n"
                    "identity.web_bot_auth.signature_agent: https://bot.example\n", "c.yaml")


def test_config_key_file_and_signature_agent_go_together(tmp_path):
    from etiquette_proxy.config import ConfigError, load_config

    key = tmp_path / "k.pem"
    write_new_key(str(key))
    with pytest.raises(ConfigError, match="c.yaml:1: identity.web_bot_auth.key_file: is set without "
                                          "identity.web_bot_auth.signature_agent"):
        load_config(f"identity.web_bot_auth.key_file: {key}\n", "c.yaml")
    with pytest.raises(ConfigError, match="--set:1: identity.web_bot_auth.signature_agent: is set without"):
        load_config("", "c.yaml", ["identity.web_bot_auth.signature_agent=https://bot.example"])
    config = load_config("", "c.yaml", [f"identity.web_bot_auth.key_file={key}",
                                        "identity.web_bot_auth.signature_agent=https://Bot.example/",
                                        "identity.web_bot_auth.validity=90s"])
    from etiquette_proxy.webbotauth import signer_from_config

    signer = signer_from_config(config)
    # draft-ietf-webbotauth-httpsig-protocol-01 §5.5: the member is fetched as is, so an origin
    # alone is sent as its well-known directory's URL.
    assert signer is not None and signer.validity_s == 90
    assert signer.signature_agent == "https://bot.example/.well-known/http-message-signatures-directory"
    assert signer_from_config(load_config("", "c.yaml")) is None


@pytest.mark.parametrize("fields", [
    (("crawler-exact-price", "USD 0.01"),),
    (("crawler-max-price", " USD 0.50 "),),
])
def test_a_price_header_is_covered_and_equals_the_library_s(fields):
    """SPEC §9: crawler-exact-price / crawler-max-price are signed (Cloudflare pay per crawl)."""
    key = ed25519.Ed25519PrivateKey.generate()
    signer = RequestSigner(key, "https://bot.example/keys.json", 300)
    covered = covered_fields([("Accept", "*/*"), *((n.title(), v) for n, v in fields)])
    assert covered == tuple((n, v.strip()) for n, v in fields)
    created = 1_796_000_000
    ours = dict(signer.sign("shop.example", created, created + 300, None, covered).headers)
    theirs = library_sign(key, "https://shop.example/a", ours["Signature-Agent"], "sig1", "sig1", created,
                          created + 300, None, tuple((n, v.strip()) for n, v in fields))
    assert ours == theirs
    name = fields[0][0]
    assert ours["Signature-Input"].startswith(f'sig1=("@authority" "signature-agent";key="sig1" "{name}");')
    assert ours["Signature-Agent"] == 'sig1="https://bot.example/keys.json"'
    # Not the cached signature of the same second without the price.
    plain = dict(signer.sign("shop.example", created, created + 300).headers)
    assert plain["Signature"] != ours["Signature"]


def test_a_price_header_that_cannot_be_signed_is_refused():
    with pytest.raises(ValueError, match="cannot sign crawler-max-price"):
        covered_fields([("crawler-max-price", "USD 1\x00")])


@pytest.mark.parametrize(("value", "sent"), [
    ("https://bot.example", "https://bot.example/.well-known/http-message-signatures-directory"),
    ("https://Bot.Example:443/", "https://bot.example/.well-known/http-message-signatures-directory"),
    ("https://bot.example/keys/jwks.json", "https://bot.example/keys/jwks.json"),
    ("https://bot.example:8443/.well-known/http-message-signatures-directory",
     "https://bot.example:8443/.well-known/http-message-signatures-directory"),
])
def test_signature_agent_is_the_directory_url_at_01(value, sent):
    """draft-ietf-webbotauth-httpsig-protocol-01 §5.2.1, §5.5: the member is the JWK Set URI."""
    assert directory_url(value) == sent


@pytest.mark.parametrize(("value", "why"), [
    ("http://bot.example/keys", "is not https"), ("https://bot.example/k#frag", "has a fragment"),
    ("https://user@bot.example/k", "has no plain host"), ('https://bot.example/"k"', "is not plain ASCII"),
    ("", "is not an https URL"),
])
def test_a_signature_agent_that_is_no_https_uri_is_refused(value, why):
    with pytest.raises(ValueError, match=why):
        directory_url(value)
