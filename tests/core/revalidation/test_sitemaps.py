"""The sitemap reader (SPEC §6 change signals): sitemaps.org's examples, index files, gzip,
text sitemaps, the 50,000-entry and 50 MB bounds, malformed and hostile XML."""

from __future__ import annotations

import gzip

import pytest

from etiquette_proxy.revalidation.sitemaps import (
    MAX_URLS,
    SitemapReader,
    looks_like_sitemap,
    parse_lastmod,
    read_sitemap,
)

# sitemaps.org protocol page, "Sample XML Sitemap"
URLSET = b"""<?xml version="1.0" encoding="UTF-8"?>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">
   <url>
      <loc>http://www.example.com/</loc>
      <lastmod>2005-01-01</lastmod>
      <changefreq>monthly</changefreq>
      <priority>0.8</priority>
   </url>
   <url>
      <loc>http://www.example.com/catalog?item=12&amp;desc=vacation_hawaii</loc>
      <changefreq>weekly</changefreq>
   </url>
   <url>
      <loc>http://www.example.com/catalog?item=73&amp;desc=vacation_new_zealand</loc>
      <lastmod>2004-12-23</lastmod>
      <changefreq>weekly</changefreq>
   </url>
   <url>
      <loc>http://www.example.com/catalog?item=74&amp;desc=vacation_newfoundland</loc>
      <lastmod>2004-12-23T18:00:15+00:00</lastmod>
      <priority>0.3</priority>
   </url>
   <url>
      <loc>http://www.example.com/catalog?item=83&amp;desc=vacation_usa</loc>
      <lastmod>2004-11-23</lastmod>
   </url>
</urlset>
"""

# sitemaps.org protocol page, "Sample XML Sitemap Index"
INDEX = b"""<?xml version="1.0" encoding="UTF-8"?>
<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">
   <sitemap>
      <loc>http://www.example.com/sitemap1.xml.gz</loc>
      <lastmod>2004-10-01T18:23:17+00:00</lastmod>
   </sitemap>
   <sitemap>
      <loc>http://www.example.com/sitemap2.xml.gz</loc>
      <lastmod>2005-01-01</lastmod>
   </sitemap>
</sitemapindex>
"""

EPOCH_2005 = 1104537600.0  # 2005-01-01T00:00:00Z


@pytest.mark.parametrize("chunk", [1, 7, 64 * 1024], ids=["byte", "small", "whole"])
def test_sample_urlset_read_in_any_chunking(chunk: int) -> None:
    sitemap = read_sitemap(URLSET, chunk=chunk)
    assert sitemap.kind == "urlset" and sitemap.problem is None and not sitemap.truncated
    assert [e.loc for e in sitemap.entries] == [
        "http://www.example.com/",
        "http://www.example.com/catalog?item=12&desc=vacation_hawaii",  # &amp; is the XML escape
        "http://www.example.com/catalog?item=73&desc=vacation_new_zealand",
        "http://www.example.com/catalog?item=74&desc=vacation_newfoundland",
        "http://www.example.com/catalog?item=83&desc=vacation_usa",
    ]
    assert [e.lastmod for e in sitemap.entries] == [
        EPOCH_2005, None, 1103760000.0, 1103824815.0, 1101168000.0]


def test_index_lists_sitemaps() -> None:
    sitemap = read_sitemap(INDEX)
    assert sitemap.kind == "sitemapindex" and sitemap.is_index
    assert [e.loc for e in sitemap.entries] == ["http://www.example.com/sitemap1.xml.gz",
                                                "http://www.example.com/sitemap2.xml.gz"]
    assert sitemap.entries[1].lastmod == EPOCH_2005


@pytest.mark.parametrize("chunk", [3, 4096], ids=["small", "large"])
def test_gzip_sitemap(chunk: int) -> None:
    sitemap = read_sitemap(gzip.compress(URLSET), chunk=chunk)
    assert sitemap.kind == "urlset" and len(sitemap.entries) == 5 and sitemap.problem is None


def test_damaged_gzip_keeps_what_was_read() -> None:
    body = gzip.compress(URLSET)
    sitemap = read_sitemap(body[: len(body) // 2])
    assert sitemap.problem is not None and sitemap.kind == "urlset"


def test_text_sitemap_only_when_the_caller_knows_it_is_one() -> None:
    body = b"http://www.example.com/\r\nhttp://www.example.com/a?b=1\n\nnot a url\nftp://x/\nhttps://www.example.com/z"
    sitemap = read_sitemap(body, text_ok=True, chunk=5)
    assert sitemap.kind == "text"
    assert [e.loc for e in sitemap.entries] == ["http://www.example.com/", "http://www.example.com/a?b=1",
                                                "https://www.example.com/z"]
    assert read_sitemap(body).kind is None  # a plain text page is not read as a sitemap by itself


def test_no_namespace_and_other_roots() -> None:
    assert read_sitemap(b"<urlset><url><loc>http://a/</loc></url></urlset>").entries[0].loc == "http://a/"
    other = read_sitemap(b"<html><body><url><loc>http://a/</loc></url></body></html>")
    assert other.kind is None and other.entries == () and other.problem is None


@pytest.mark.parametrize("text,expected", [
    ("2005", EPOCH_2005), ("2005-01", EPOCH_2005), ("2005-01-01", EPOCH_2005),
    ("2005-01-01T00:00Z", EPOCH_2005), ("2005-01-01T01:00:00+01:00", EPOCH_2005),
    ("2005-01-01T00:00:00.5Z", EPOCH_2005 + 0.5), ("2005-01-01T00:00:00", EPOCH_2005),
    ("yesterday", None), ("", None), ("2005-13-01", None), ("9" * 100, None),
], ids=lambda v: str(v)[:20])
def test_lastmod_w3c_datetime(text: str, expected: float | None) -> None:
    assert parse_lastmod(text) == expected


def test_malformed_xml_keeps_entries_before_the_fault() -> None:
    sitemap = read_sitemap(b"<urlset><url><loc>http://a/1</loc></url><url><loc>http://a/2</loc></url><url><lo")
    assert [e.loc for e in sitemap.entries] == ["http://a/1", "http://a/2"]
    assert sitemap.problem is not None and sitemap.problem.startswith("malformed XML")
    mismatched = read_sitemap(b"<urlset><url><loc>http://a/1</loc></url></url></urlset>")
    assert mismatched.problem is not None and [e.loc for e in mismatched.entries] == ["http://a/1"]


BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol1 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol2 "&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol9 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
]>
<urlset><url><loc>http://a/&lol9;</loc></url></urlset>"""
EXTERNAL_ENTITY = b"""<?xml version="1.0"?>
<!DOCTYPE urlset [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>
<urlset><url><loc>http://a/&xxe;</loc></url></urlset>"""
EXTERNAL_DTD = b"""<?xml version="1.0"?>
<!DOCTYPE urlset SYSTEM "http://127.0.0.1:1/evil.dtd">
<urlset><url><loc>http://a/</loc></url></urlset>"""


@pytest.mark.parametrize("body", [BILLION_LAUGHS, EXTERNAL_ENTITY, EXTERNAL_DTD],
                         ids=["billion-laughs", "external-entity", "external-dtd"])
def test_hostile_xml_refused(body: bytes) -> None:
    sitemap = read_sitemap(body)
    assert sitemap.entries == ()
    assert sitemap.problem is not None and sitemap.problem.startswith("refused hostile XML")
    assert read_sitemap(gzip.compress(body)).problem == sitemap.problem


def _urlset(n: int) -> bytes:
    return (b"<urlset xmlns='http://www.sitemaps.org/schemas/sitemap/0.9'>"
            + b"".join(b"<url><loc>http://a/p%d</loc><lastmod>2024-01-01</lastmod></url>" % i for i in range(n))
            + b"</urlset>")


def test_fifty_thousand_urls_read_and_one_more_refused() -> None:
    full = read_sitemap(_urlset(MAX_URLS))
    assert len(full.entries) == MAX_URLS and full.problem is None and not full.truncated
    over = read_sitemap(gzip.compress(_urlset(MAX_URLS + 1)))
    assert len(over.entries) == MAX_URLS and over.truncated
    assert over.problem is not None and "50,000" in over.problem
    text = read_sitemap(b"\n".join(b"http://a/%d" % i for i in range(MAX_URLS + 5)), text_ok=True)
    assert len(text.entries) == MAX_URLS and text.truncated


def test_byte_bound_stops_a_gzip_bomb() -> None:
    reader = SitemapReader(max_bytes=1_000_000)
    bomb = gzip.compress(b"<urlset>" + b" " * 50_000_000)  # ~50 KB that inflates to 50 MB
    for start in range(0, len(bomb), 8192):
        reader.feed(bomb[start:start + 8192])
    sitemap = reader.close()
    assert sitemap.truncated and sitemap.problem is not None and "1,000,000 bytes" in sitemap.problem
    assert reader._bytes == 1_000_000  # nothing past the bound was taken in


def test_sniffing() -> None:
    assert looks_like_sitemap(URLSET) and looks_like_sitemap(INDEX)
    assert looks_like_sitemap(gzip.compress(URLSET))
    assert not looks_like_sitemap(b"<!doctype html><html>")
    assert not looks_like_sitemap(gzip.compress(b"<html>hello</html>"))
    assert not looks_like_sitemap(b"\x1f\x8bnot really gzip")
