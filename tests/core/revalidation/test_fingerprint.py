from __future__ import annotations

import hashlib
import random
import re

import pytest

from etiquette_proxy.config import defaults
from etiquette_proxy.revalidation.fingerprint import Fingerprint, Fingerprinter

PAGE = """<html><head>
<meta name="csrf-token" content="{token}">
<script nonce="{nonce}">window.csrfToken = "{token}";</script>
</head><body>
<h1>Article</h1>
<p>The body text that matters.</p>
<form><input type="hidden" name="authenticity_token" value="{token}"></form>
<footer>Generated {iso} at {clock} (build {epoch}) · {http_date}</footer>
<!-- {seed_token} -->
</body></html>"""

A = dict(token="aaa111", nonce="n1", iso="2024-05-01T14:02:11Z", clock="14:02:11",
         epoch="1714572131", http_date="Wed, 01 May 2024 14:02:11 GMT", seed_token="csrf_token=abc")
B = dict(token="zzz999", nonce="n2", iso="2024-05-02 09:15:00.123+02:00", clock="9:15:00",
         epoch="1714634100123", http_date="Thu, 02 May 2024 09:15:00 GMT",
         seed_token="csrf_token=xyz")


def fp(page: str, fingerprinter: Fingerprinter | None = None) -> str:
    return (fingerprinter or Fingerprinter()).fingerprint(page.encode()).digest


def test_page_differing_only_in_volatile_blocks_is_unchanged() -> None:
    assert fp(PAGE.format(**A)) == fp(PAGE.format(**B))


@pytest.mark.parametrize("field", sorted(A))
def test_each_volatile_block_alone_is_stripped(field: str) -> None:
    changed = dict(A, **{field: B[field]})
    assert fp(PAGE.format(**A)) == fp(PAGE.format(**changed))


def test_a_real_text_change_is_a_change() -> None:
    edited = PAGE.replace("matters", "matters more")
    assert fp(PAGE.format(**A)) != fp(edited.format(**A))


def test_whitespace_runs_do_not_count() -> None:
    assert fp("<p>a  b</p>\n\n") == fp("<p>a b</p>")


def test_input_tags_without_tokens_are_kept() -> None:
    assert fp('<input name="q" value="one">') != fp('<input name="q" value="two">')


def test_configured_volatile_patterns_are_stripped() -> None:
    a, b = "<p>Visitors: 1041</p><p>news</p>", "<p>Visitors: 1187</p><p>news</p>"
    assert fp(a) != fp(b)
    site = Fingerprinter([r"Visitors: \d+"])
    assert fp(a, site) == fp(b, site)


def test_from_config_reads_site_patterns() -> None:
    config = defaults()
    assert Fingerprinter.from_config(config, "example.com:443").fingerprint(b"x").digest == fp("x")


def test_bad_pattern_raises_value_error() -> None:
    with pytest.raises(ValueError):
        Fingerprinter(["("])


@pytest.mark.parametrize(
    "body",
    [b"", b"\x00\x01binary\x00" * 100, b"\xff\xfe not utf-8 \xc3", b"<" * 100_000, b"<meta " * 20_000],
)
def test_junk_bodies_fingerprint_without_crashing(body: bytes) -> None:
    digest = Fingerprinter().fingerprint(body).digest
    assert len(digest) == 64


def test_binary_bodies_are_hashed_as_they_are() -> None:
    a = b"\x00PNG 2024-05-01T14:02:11Z"
    b = b"\x00PNG 2024-05-02T14:02:11Z"
    assert fp_bytes(a) != fp_bytes(b)


def fp_bytes(body: bytes) -> str:
    return Fingerprinter().fingerprint(body).digest


@pytest.mark.parametrize(("previous", "changed"), [(None, None), ("x" * 64, True)])
def test_changed_from(previous: str | None, changed: bool | None) -> None:
    f = Fingerprint("y" * 64)
    assert f.changed_from(previous) is changed
    assert f.changed_from(f.digest) is False


def test_timestamps_are_stripped_on_pages_without_any_token() -> None:
    assert fp("<p>News</p><i>Generated 2024-05-01T14:02:11Z</i>") == fp(
        "<p>News</p><i>Generated 2024-06-30T01:00:00Z</i>"
    )


# -- the fast scan finds exactly what re.sub finds (issue 17) ----------------------------------

def reference_fingerprint(body: bytes) -> str:
    """Fingerprinter.fingerprint as plain re.sub passes of BUILTIN_PATTERNS (before issue 17)."""
    from etiquette_proxy.revalidation import fingerprint as module

    if b"\x00" in body[:1024]:
        return hashlib.sha256(body).hexdigest()
    lowered = body.lower()
    has_token_words = any(word in lowered for word in module._TOKEN_WORDS)  # noqa: SLF001
    data = module._TOKEN_TAG.sub(module._drop_token_tag, body) if has_token_words else body  # noqa: SLF001
    for p in module.BUILTIN_PATTERNS:
        if has_token_words or not ("csrf" in p or "nonce" in p):
            data = re.compile(p.encode("ascii")).sub(b" ", data)
    return hashlib.sha256(b" ".join(data.split())).hexdigest()


# Pieces that match, nearly match, or sit next to the patterns: digits and word bytes on both
# sides of a boundary, overlapping candidates, mixed case, non-ASCII bytes.
PIECES = [
    b"2024-05-01T14:02:11Z", b"2024-05-01 14:02", b"12024-05-01 14:02", b"x2024-05-01T14:02:11.5+02:00",
    b"1999-12-31T23:59", b"2024-05-01T1", b"--", b"-12-12 12:", b"Wed, 01 May 2024 14:02:11 GMT",
    b"Thu 2 Jan 2025 09:15 +0100", b"xMon, 01 May 2024 14:02:11 GMT", b"Sun,  1 May", b"14:02:11",
    b"9:15:00.123", b"123:45:67", b"1:2:3", b"12:34:56:78", b"::", b":12:", b"1714572131",
    b"1714572131123", b"a1714572131", b"17145721311", b"1499999999", b"15000000000000",
    b'nonce="abc"', b"nonce = 'x y'", b"nonce=abc>", b"xnonce=1", b"NONCE=1", b'csrfToken: "t"',
    b"XSRF_token='q'", b'"authenticity_token":"v"', b"Nonce = 'n'", b"csrf_token=abc", b"session-token123",
    b"SessionToken=z", b"xcsrf_token=1", b"<input name=csrf value=1>", b"<META name=x-csrf content=2>",
    b"token", b"1", b"5", b"-", b":", b" ", b"\n", b"\t", b"a", b"Z", b"_", b"\xc3\xa9", b"\xff",
    b"Mon", b"GMT", b"=", b'"', b"'", b">", b"<p>",
]


@pytest.mark.parametrize("seed", range(300))
def test_the_fast_scan_matches_plain_re_sub(seed: int) -> None:
    rng = random.Random(seed)
    body = b"".join(rng.choice(PIECES) for _ in range(rng.randint(0, 60)))
    assert Fingerprinter().fingerprint(body).digest == reference_fingerprint(body), body


def test_the_fast_scan_matches_plain_re_sub_on_the_test_pages() -> None:
    for values in (A, B):
        page = PAGE.format(**values).encode()
        assert Fingerprinter().fingerprint(page).digest == reference_fingerprint(page)
        assert Fingerprinter().fingerprint(page.upper()).digest == reference_fingerprint(page.upper())


@pytest.mark.parametrize("piece", [b"Mon, 01 May 2024 12:00:00 GMT ", b":00:00:", b"1714572131 ",
                                   b"nonce=1 csrf_token=2 "])
def test_a_body_dense_with_candidates_gets_the_same_fingerprint(piece: bytes) -> None:
    """So many places to try that plain re.sub takes over: the same result."""
    body = piece * 2000
    assert Fingerprinter().fingerprint(body).digest == reference_fingerprint(body)
    assert Fingerprinter().fingerprint(b"x" * 100 + body).digest == reference_fingerprint(b"x" * 100 + body)
