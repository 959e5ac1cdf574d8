from __future__ import annotations

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
