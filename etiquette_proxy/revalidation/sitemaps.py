"""Sitemaps read as bytes arrive (SPEC §6 change signals, seed 004 `urls_from_sitemap`).

One `SitemapReader` per body: `feed()` it chunks as they come, `close()` it, read `result()`.
It understands what sitemaps.org defines: a `<urlset>` (pages with their `<lastmod>`), a
`<sitemapindex>` (more sitemaps), either of them gzip-compressed, and a text sitemap (one URL
a line). Nothing is built in memory but the (loc, lastmod) pairs: the XML is parsed by events.

Bounds (sitemaps.org: "no more than 50,000 URLs and must be no larger than 50MB (52,428,800
bytes)", uncompressed): past MAX_URLS entries or MAX_BYTES of decompressed text the reader
stops and says so (`truncated`); a gzip bomb stops at the same byte count, never allocating
more. Hostile XML is refused by defusedxml (no DTD, no entity declarations, no external
references: billion laughs and XXE never expand). Malformed XML never raises: the pairs read
before the fault are kept and `problem` says what went wrong (the caller logs it once).
"""

from __future__ import annotations

import logging
import re
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal
from xml.etree.ElementTree import ParseError

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import DefusedXMLParser

log = logging.getLogger(__name__)

MAX_URLS = 50_000  # sitemaps.org: entries per file (urlset and sitemapindex alike)
MAX_BYTES = 52_428_800  # sitemaps.org: 50 MB uncompressed per file
_GZIP_MAGIC = b"\x1f\x8b"
_INFLATE_STEP = 1024 * 1024  # gzip output taken at most this much at a time (bounded memory)
_LOC_MAX = 2048  # sitemaps.org: a <loc> is "less than 2,048 characters"

Kind = Literal["urlset", "sitemapindex", "text"]


@dataclass(frozen=True)
class SitemapEntry:
    """One `<url>` (or `<sitemap>`, or text line): where, and when the site says it last changed."""

    loc: str
    lastmod: float | None  # epoch seconds (UTC), None when absent or unreadable


@dataclass(frozen=True)
class Sitemap:
    """What one sitemap file said, as far as it could be read."""

    kind: Kind | None  # None: not a sitemap (another XML root, or nothing readable)
    entries: tuple[SitemapEntry, ...]  # pages of a urlset/text sitemap, sitemaps of an index
    problem: str | None = None  # malformed, hostile or over a bound: what was read is kept
    truncated: bool = False  # stopped at MAX_URLS or MAX_BYTES

    @property
    def is_index(self) -> bool:
        return self.kind == "sitemapindex"


_W3C_PARTIAL = re.compile(r"^(\d{4})(?:-(\d{2}))?$")


def parse_lastmod(text: str) -> float | None:
    """A W3C Datetime (sitemaps.org `<lastmod>`: YYYY, YYYY-MM, YYYY-MM-DD, or a full date and
    time with a zone) as epoch seconds; None for anything else. A time without a zone is UTC."""
    text = text.strip()
    if not text or len(text) > 40:
        return None
    partial = _W3C_PARTIAL.match(text)
    try:
        if partial is not None:
            moment = datetime(int(partial.group(1)), int(partial.group(2) or 1), 1, tzinfo=UTC)
        else:
            moment = datetime.fromisoformat(text.replace("z", "Z"))
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=UTC)
    except ValueError:
        return None
    return moment.timestamp()


def _local(tag: str) -> str:
    """`{namespace}name` -> name: sitemaps in the 0.9 namespace, an older one, or none alike."""
    return tag.rsplit("}", 1)[-1]


class _Events:
    """The XML parser's target: keeps (loc, lastmod) of each `<url>` / `<sitemap>`, nothing else."""

    def __init__(self, reader: SitemapReader):
        self.reader = reader
        self.depth = 0
        self.root: str | None = None
        self.field: str | None = None  # "loc" or "lastmod" while inside one
        self.text: list[str] = []
        self.loc: str | None = None
        self.lastmod: str | None = None

    def start(self, tag: str, attrib: dict[str, str]) -> None:
        self.depth += 1
        name = _local(tag)
        if self.depth == 1:
            self.root = name
            if name not in ("urlset", "sitemapindex"):
                raise _NotASitemap(name)
        elif self.depth == 2:
            self.loc = self.lastmod = None
        elif self.depth == 3 and name in ("loc", "lastmod"):
            self.field, self.text = name, []

    def data(self, text: str) -> None:
        if self.field is not None and sum(map(len, self.text)) < _LOC_MAX:
            self.text.append(text)

    def end(self, tag: str) -> None:
        if self.depth == 3 and self.field is not None:
            value = "".join(self.text).strip()
            if self.field == "loc":
                self.loc = value
            else:
                self.lastmod = value
            self.field = None
        elif self.depth == 2 and _local(tag) in ("url", "sitemap") and self.loc:
            self.reader._add(self.loc, parse_lastmod(self.lastmod) if self.lastmod else None)
        self.depth -= 1

    def close(self) -> None:
        return None


class _NotASitemap(Exception):
    pass


class _Full(Exception):
    pass


class SitemapReader:
    """Reads one sitemap body incrementally (module docstring). `text_ok`: a body that is not
    XML is read as a text sitemap (the caller knows it is a sitemap: robots.txt named it)."""

    def __init__(self, text_ok: bool = False, max_urls: int = MAX_URLS, max_bytes: int = MAX_BYTES):
        self.text_ok = text_ok
        self.max_urls = max_urls
        self.max_bytes = max_bytes
        self.entries: list[SitemapEntry] = []
        self.kind: Kind | None = None
        self.problem: str | None = None
        self.truncated = False
        self._done = False
        self._started = False
        self._inflate: zlib._Decompress | None = None
        self._bytes = 0  # decompressed bytes read
        self._events: _Events | None = None
        self._xml: DefusedXMLParser | None = None
        self._line = b""  # a text sitemap's unfinished last line

    # -- input -------------------------------------------------------------------------------

    def feed(self, chunk: bytes) -> None:
        """The next bytes of the body as the site sent it (gzip or plain)."""
        if self._done or not chunk:
            return
        if not self._started:
            self._started = True
            if chunk[:2] == _GZIP_MAGIC:
                self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        if self._inflate is None:
            self._plain(chunk)
            return
        data = chunk
        while not self._done:
            try:
                out = self._inflate.decompress(data, _INFLATE_STEP)
            except zlib.error as e:
                self._stop(f"gzip data is damaged: {e}")
                return
            if out:
                self._plain(out)
            data = self._inflate.unconsumed_tail
            if not data:
                return

    def close(self) -> Sitemap:
        """The end of the body: what the sitemap said (also `result()`)."""
        if not self._done:
            if self._inflate is not None:
                rest = self._inflate.flush(_INFLATE_STEP)
                if rest:
                    self._plain(rest)
                if not self._done and not self._inflate.eof:
                    self._stop("gzip data ends early")
            if not self._done:
                self._finish()
        self._done = True
        return self.result()

    def result(self) -> Sitemap:
        return Sitemap(self.kind, tuple(self.entries), self.problem, self.truncated)

    # -- plain text of the body ----------------------------------------------------------------

    def _plain(self, data: bytes) -> None:
        if self._bytes + len(data) > self.max_bytes:
            data = data[: self.max_bytes - self._bytes]
            self._bytes = self.max_bytes
            self._take(data)
            self.truncated = True
            self._stop(f"larger than {self.max_bytes:,} bytes uncompressed (sitemaps.org limit): read up to there")
            return
        self._bytes += len(data)
        self._take(data)

    def _take(self, data: bytes) -> None:
        if self._done or not data:
            return
        if self._xml is None and self.kind != "text":
            head = data.lstrip(b"\xef\xbb\xbf \t\r\n")
            if not head:
                return  # only whitespace so far
            if head[:1] == b"<":
                self._events = _Events(self)
                self._xml = DefusedXMLParser(target=self._events, forbid_dtd=True,
                                             forbid_entities=True, forbid_external=True)
            elif self.text_ok:
                self.kind = "text"
            else:
                self._stop(None)  # not XML, and nobody said it is a text sitemap: not one
                return
        if self._xml is not None:
            self._feed_xml(data)
        else:
            self._text(data)

    def _feed_xml(self, data: bytes) -> None:
        assert self._xml is not None and self._events is not None
        try:
            self._xml.feed(data)
        except _Full:
            self._stop(None)
        except _NotASitemap as e:
            self.kind = None
            self._stop(None if not self.entries else f"root element <{e}>")
        except DefusedXmlException as e:
            self._stop(f"refused hostile XML: {type(e).__name__}")
        except (ParseError, ValueError, UnicodeError) as e:
            self._stop(f"malformed XML: {e}")
        else:
            root = self._events.root
            if root is not None and self.kind is None:
                self.kind = "urlset" if root == "urlset" else "sitemapindex"

    def _finish(self) -> None:
        if self._xml is not None:
            try:
                self._xml.close()
            except _Full:
                pass
            except DefusedXmlException as e:
                self.problem = self.problem or f"refused hostile XML: {type(e).__name__}"
            except (ParseError, ValueError, UnicodeError, _NotASitemap) as e:
                if self._events is not None and self._events.root in ("urlset", "sitemapindex"):
                    self.problem = self.problem or f"malformed XML: {e}"
        elif self.kind == "text" and self._line:
            self._text_line(self._line)
            self._line = b""

    def _text(self, data: bytes) -> None:
        lines = (self._line + data).split(b"\n")
        self._line = lines.pop()
        if len(self._line) > 4 * _LOC_MAX:  # no URL is that long: not a text sitemap line
            self._line = b""
        for line in lines:
            if self._done:
                return
            self._text_line(line)

    def _text_line(self, line: bytes) -> None:
        # sitemaps.org text format: one URL a line, UTF-8, nothing else on the line.
        url = line.strip().decode("utf-8", "replace")
        if url.startswith(("http://", "https://")) and len(url) < _LOC_MAX and " " not in url:
            try:
                self._add(url, None)
            except _Full:
                self._stop(None)

    # -- output --------------------------------------------------------------------------------

    def _add(self, loc: str, lastmod: float | None) -> None:
        if len(self.entries) >= self.max_urls:
            self.truncated = True
            self.problem = self.problem or f"more than {self.max_urls:,} entries (sitemaps.org limit): the rest ignored"
            raise _Full
        self.entries.append(SitemapEntry(loc, lastmod))

    def _stop(self, problem: str | None) -> None:
        if problem is not None and self.problem is None:
            self.problem = problem
        self._done = True
        self._xml = None


def read_sitemap(body: bytes, text_ok: bool = False, chunk: int = 64 * 1024) -> Sitemap:
    """A whole body read as the reader reads a stream (in `chunk`-byte pieces)."""
    reader = SitemapReader(text_ok=text_ok)
    for start in range(0, len(body), chunk):
        reader.feed(body[start:start + chunk])
    return reader.close()


def looks_like_sitemap(head: bytes) -> bool:
    """Whether a body's first bytes may be a sitemap worth reading: XML (gzip-compressed or not)
    whose first KiB names a `urlset` or `sitemapindex` element (cheap: asked of every 200)."""
    if head[:2] == _GZIP_MAGIC:
        try:  # the first KiB of what it inflates to, never more
            head = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head[:64 * 1024], 1024)
        except zlib.error:
            return False
    start = head[:1024].lstrip(b"\xef\xbb\xbf \t\r\n")
    return start[:1] == b"<" and (b"urlset" in start or b"sitemapindex" in start)


def sitemaps_in_robots(text: str) -> tuple[str, ...]:
    """The `Sitemap:` URLs of a robots.txt (RFC 9309 §2.2.4: records other than the rules;
    sitemaps.org: "Sitemap: <sitemap_location>", anywhere in the file), in order, once each."""
    found: dict[str, None] = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip().lower() == "sitemap":
            url = value.split("#", 1)[0].strip()
            if url.startswith(("http://", "https://")) and len(url) < _LOC_MAX:
                found[url] = None
    return tuple(found)


def starts_with_url(head: bytes) -> bool:
    """Whether a body's first bytes are an absolute http(s) URL (a text sitemap's first line)."""
    return head.lstrip(b"\xef\xbb\xbf \t\r\n")[:8].lower().startswith((b"http://", b"https://"))


def named_like_text_sitemap(url: str) -> bool:
    """A URL whose name says it is a text sitemap (`.../sitemap.txt`, `sitemap-1.txt`): read as
    one when it passes (a sitemap robots.txt names is known without its name)."""
    path = url.split("?", 1)[0].rsplit("/", 1)[-1].lower()
    return "sitemap" in path and path.endswith(".txt")
