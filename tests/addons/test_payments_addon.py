"""The payment hooks on hand-made flows (SPEC §9): a client's own prices never reach the site,
an offer is signed with its price covered, and an offer that never got an answer goes back
to the budget."""

from __future__ import annotations

import asyncio

from cryptography.hazmat.primitives.asymmetric import ed25519
from addons.identity import RequestSigning
from addons.notes import notes_of
from addons.payments import Payments
from tests.addons.test_chain_dispatch import settled
from addons.runtime import Runtime
from etiquette_proxy.side_fetch import UpstreamPath
from mitmproxy import http
from mitmproxy.test import tflow, tutils

from etiquette_proxy.config import load_config_file
from etiquette_proxy.webbotauth import RequestSigner

PAYING = ['payments.max_price="USD 0.02"', 'payments.daily_budget="USD 0.02"']


def runtime(sets: list[str]) -> Runtime:
    signer = RequestSigner(ed25519.Ed25519PrivateKey.generate(), "https://bot.example/keys.json", 300)
    return Runtime(config=load_config_file(None, sets), upstream=UpstreamPath(signer=signer))


def flow(*extra: tuple[bytes, bytes]) -> http.HTTPFlow:
    req = tutils.treq(host="shop.test", port=80, path=b"/page", headers=((b"host", b"shop.test"), *extra))
    return tflow.tflow(req=req)


def test_a_client_s_own_price_never_reaches_the_site_even_without_payments():
    f = flow((b"crawler-max-price", b"USD 100"), (b"Crawler-Exact-Price", b"USD 1"))
    asyncio.run(settled(Payments(runtime([])).request(f)))
    assert "crawler-max-price" not in f.request.headers and "crawler-exact-price" not in f.request.headers
    assert notes_of(f).extra["payment_headers_dropped"] == ["crawler-exact-price", "crawler-max-price"]
    assert f.response is None


def test_an_offer_is_signed_with_its_price_and_comes_back_when_no_answer_came():
    rt = runtime(PAYING)
    payments = Payments(rt)

    async def scenario() -> None:
        service = payments.service
        await service.ledger.learn_price(service.today(), "shop.test:80", "USD 0.02")
        f = flow()
        await settled(payments.request(f))
        assert f.request.headers["crawler-max-price"] == "USD 0.02"
        RequestSigning(rt).request(f)
        assert '"signature-agent";key="sig1" "crawler-max-price");' in f.request.headers["Signature-Input"]
        # The whole budget is reserved: a second request in flight is answered here.
        g = flow()
        await settled(payments.request(g))
        assert g.response is not None and g.response.status_code == 402
        assert g.response.headers["crawler-price"] == "USD 0.02"
        assert "held by requests still at a site" in notes_of(g).reason
        assert g.response.headers["Retry-After"] == "5"  # not stopped for the day: it may come back
        await payments.error(f)  # reset before any answer: nothing was charged, the offer comes back
        h = flow()
        await settled(payments.request(h))
        assert h.response is None and h.request.headers["crawler-max-price"] == "USD 0.02"

    asyncio.run(scenario())


def test_observe_mode_pays_nothing_and_says_so():
    rt = runtime([*PAYING, "mode=observe"])
    payments = Payments(rt)
    f = flow()
    f.response = http.Response.make(402, b"pay", {"crawler-price": "USD 0.01"})

    async def scenario() -> None:
        await settled(payments.request(f))
        assert "crawler-max-price" not in f.request.headers
        await settled(payments.responseheaders(f))

    asyncio.run(scenario())
    assert f.response.status_code == 402
    assert notes_of(f).reason == "402 pay per crawl: crawler-price USD 0.01: not paid (observe mode pays nothing)"
