"""The signing hook on hand-made flows (SPEC §9): signed last, never over a client's own
signature, not in observe mode, not for local answers, and never a crash on an odd Host."""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric import ed25519
from mitmproxy import http
from mitmproxy.test import tflow, tutils

from addons.identity import CLIENT_SIGNED, RequestSigning
from addons.notes import notes_of
from addons.runtime import Runtime
from etiquette_proxy.config import load_config_file
from etiquette_proxy.side_fetch import UpstreamPath
from etiquette_proxy.webbotauth import RequestSigner


def runtime(mode: str = "enforce", signing: bool = True) -> Runtime:
    signer = RequestSigner(ed25519.Ed25519PrivateKey.generate(), "https://bot.example", 300) if signing else None
    return Runtime(config=load_config_file(None, [f"mode={mode}"]), upstream=UpstreamPath(signer=signer))


def flow(host_header: bytes = b"Site.Test:80", extra: tuple[tuple[bytes, bytes], ...] = ()) -> http.HTTPFlow:
    req = tutils.treq(host="site.test", port=80, path=b"/page",
                      headers=((b"host", host_header), (b"user-agent", b"bot/1"), *extra))
    return tflow.tflow(req=req)


def test_a_request_is_signed_for_the_authority_the_site_will_see():
    rt = runtime()
    f = flow(extra=((b"if-none-match", b'"v1"'),))
    RequestSigning(rt).request(f)
    headers = f.request.headers
    assert headers["Signature-Agent"] == 'sig1="https://bot.example"'
    assert headers["Signature-Input"].startswith('sig1=("@authority" "signature-agent";key="sig1");created=')
    assert headers["Signature"].startswith("sig1=:")
    assert headers["if-none-match"] == '"v1"'
    assert notes_of(f).extra["signed"] == rt.upstream.signer.keyid
    # What was signed is site.test (lower case, :80 dropped): the same call gives the same bytes.
    again = rt.upstream.signer.sign("site.test")
    assert dict(again.headers)["Signature"] == headers["Signature"]


def test_a_client_signature_is_left_alone_and_logged():
    f = flow(extra=((b"signature-input", b'own=("@authority");created=1'), (b"signature", b"own=:AAAA:")))
    RequestSigning(runtime()).request(f)
    assert f.request.headers["signature-input"] == 'own=("@authority");created=1'
    assert "Signature-Agent" not in f.request.headers
    assert notes_of(f).extra == {"not_signed": CLIENT_SIGNED}


def test_observe_mode_changes_nothing_on_the_wire():
    rt = runtime(mode="observe")
    f = flow()
    RequestSigning(rt).request(f)
    assert "Signature" not in f.request.headers
    assert notes_of(f).extra == {"would_sign": rt.upstream.signer.keyid}


def test_local_answers_and_no_key_are_not_signed():
    f = flow()
    f.response = http.Response.make(403, b"no")
    RequestSigning(runtime()).request(f)
    unsigned = flow()
    RequestSigning(runtime(signing=False)).request(unsigned)
    for g in (f, unsigned):
        assert "Signature" not in g.request.headers and "signed" not in notes_of(g).extra


def test_a_host_no_signature_can_cover_is_sent_unsigned_and_said_so():
    f = flow(host_header=b"bad host")
    RequestSigning(runtime()).request(f)
    assert "Signature" not in f.request.headers
    assert notes_of(f).extra["not_signed"] == "cannot sign for authority 'bad host'"
