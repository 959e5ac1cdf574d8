"""Classify each response (or connection error) into one hostility signal (SPEC §8, seed 000).

The seed article's table: a *hard block* is an explicit refusal (403, 429, connection reset);
a *challenge* is a CAPTCHA or interstitial (the site suspects automation and is testing); a
*soft block* is a refusal dressed as success (2xx carrying a block page, an empty result, or a
body far below the site's normal size for that page type). Everything here is pure: the size
norm a soft block is measured against is passed in (see `SizeNorm`).
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from statistics import median_low
from typing import Any

from etiquette_proxy.bodies import ZLIB_CODINGS, BodyCopy, decode_head
from etiquette_proxy.headers import field_text

# SPEC §8: inspect only the first ~64 KiB; challenge and block pages put their markers early.
HEAD_BYTES = 64 * 1024

# Built-in markers, lower-case bytes (bodies may be in any encoding; ASCII markers are searched
# byte-wise after an ASCII lower-casing, so a UTF-16 body simply never matches).
CHALLENGE_MARKERS: tuple[bytes, ...] = (
    b"just a moment...",  # Cloudflare interstitial <title>
    b"cf-chl",  # Cloudflare challenge ids (cf-chl-widget, cf-chl-bypass)
    b"_cf_chl",  # Cloudflare challenge options (window._cf_chl_opt)
    b"challenge-platform",  # Cloudflare /cdn-cgi/challenge-platform/
    b"g-recaptcha",
    b"h-captcha",
    b"hcaptcha",
    b"px-captcha",  # PerimeterX / HUMAN
    b"/_incapsula_resource",  # Imperva Incapsula
    b"datadome",
    b"captcha-delivery",  # DataDome's challenge host (geo.captcha-delivery.com)
    b"attention required!",  # Cloudflare block/challenge <title>
    b"verify you are human",
)
BLOCK_MARKERS: tuple[bytes, ...] = (
    b"access denied",
    b"unusual traffic",
    b"you have been blocked",
    b"rate limit exceeded",
)

# A soft block by size: below 10% of the site's running median for that content type
# (SPEC §8), once the median rests on enough samples to mean something.
SMALL_BODY_FRACTION = 0.10
SIZE_MIN_SAMPLES = 20
SIZE_SAMPLES = 65
SIZE_MAX_TYPES = 16
# Built-in markers are generic: Cloudflare injects /cdn-cgi/challenge-platform/ scripts into
# ordinary pages, login forms carry g-recaptcha, articles say "access denied". An interstitial or
# block page is small, so a 2xx body at least half the site's usual size for its type is taken
# as content and the built-in markers are not searched. Markers the operator configured for the
# site are always searched (they know that site's pages).
INTERSTITIAL_FRACTION = 0.5

_HARD_STATUSES = {403: "status 403", 429: "status 429"}
# Connection errors that mean the site cut us off (a reset or an abrupt close), as opposed
# to a route or DNS failure: seed 000 counts connection resets as hard blocks.
# mitmproxy 11 reports a site that resets (or drops) the connection before answering as
# "server closed connection" (checked on loopback with an RST after the request arrived).
_RESET_WORDS = (
    "reset", "econnreset", "aborted", "peer closed", "server closed connection",
    "disconnected", "broken pipe",
)


class Signal(StrEnum):
    """What one response says about the site's attitude."""

    OK = "ok"
    HARD_BLOCK = "hard_block"
    CHALLENGE = "challenge"
    SOFT_BLOCK = "soft_block"
    # A network failure or 5xx: not hostility (a broken upstream is not a hostile site), but
    # counted for the route-versus-site diagnosis.
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class Classification:
    signal: Signal
    why: str
    # True when only the size rule made this a soft block: the size still feeds the site's
    # norm, so a redesign to smaller pages is learned once it is the majority (see SizeNorm).
    by_size: bool = False


_OK = Classification(Signal.OK, "")


@dataclass(frozen=True)
class Markers:
    """Challenge and block-page markers for one site: built-ins plus configured ones."""

    challenge: tuple[bytes, ...] = CHALLENGE_MARKERS
    block: tuple[bytes, ...] = BLOCK_MARKERS
    site_challenge: tuple[bytes, ...] = ()
    site_block: tuple[bytes, ...] = ()

    @classmethod
    def for_site(cls, challenge: Iterable[str] = (), block: Iterable[str] = ()) -> Markers:
        """Built-in markers plus `health.challenge_markers` / `health.block_markers`."""
        markers = cls(site_challenge=_encode(challenge), site_block=_encode(block))
        # Immutable, so sites with the same configured markers share one object (bounded: one
        # per distinct per-site override; past the bound a copy is merely not shared).
        kept = _SHARED_MARKERS.get(markers)
        if kept is None:
            if len(_SHARED_MARKERS) >= 1024:
                return markers
            kept = _SHARED_MARKERS[markers] = markers
        return kept


_SHARED_MARKERS: dict[Markers, Markers] = {}


def _encode(markers: Iterable[str]) -> tuple[bytes, ...]:
    return tuple(m.lower().encode("utf-8") for m in markers if m)


def media_type(content_type: str | None) -> str:
    """`text/html; charset=utf-8` -> `text/html`; missing -> ``."""
    if not content_type:
        return ""
    media = _MEDIA_TYPES.get(content_type)
    if media is None:
        media = content_type.split(";", 1)[0].strip().lower()[:64]
        # A site sends a handful of Content-Type texts: each is read once (bounded; one with a
        # per-response parameter, a multipart boundary, is merely read again).
        if len(_MEDIA_TYPES) < 512:
            _MEDIA_TYPES[content_type] = media
    return media


_MEDIA_TYPES: dict[str, str] = {}


def _is_text(media: str) -> bool:
    # Images, fonts, video never carry a challenge page; an unlabeled body might.
    return (
        not media
        or media.startswith("text/")
        or "html" in media
        or "json" in media
        or "xml" in media
        or "javascript" in media
    )


def _find(haystack: bytes, markers: tuple[bytes, ...]) -> bytes | None:
    # bytes.find, not `in`: CPython 3.11's `marker in haystack` first reads the marker as an
    # int (`7 in b"..."`), raising and formatting a TypeError it then clears, ~1,000
    # instructions per marker; find asks for a buffer first.
    find = haystack.find
    for m in markers:
        if find(m) != -1:
            return m
    return None


def classify_response(
    status: int,
    headers: Mapping[str, str],
    body_head: bytes,
    body_size: int,
    *,
    markers: Markers = Markers(),
    method: str = "GET",
    normal_size: float | None = None,
    media: str | None = None,
) -> Classification:
    """The hostility signal of one response; `normal_size` is the site's median for its type,
    `media` its media type when the caller has read it already (else read here)."""
    if media is None:
        media = media_type(field_text(headers, "content-type"))
    mitigated = headers.get("cf-mitigated")  # field_text's answer, one lookup when present
    if mitigated is None and type(headers) is dict:
        mitigated = field_text(headers, "cf-mitigated")  # a plain dict: the name in any case
    if mitigated and str(mitigated).strip().lower() == "challenge":
        return Classification(Signal.CHALLENGE, "cf-mitigated: challenge")
    is_2xx = 200 <= status < 300
    # Most responses: a 2xx of at least half the site's usual size for its type, no markers of
    # the site's own. The built-in markers are not searched for it (INTERSTITIAL_FRACTION), no
    # status rule applies to a 2xx, it is not empty (> 256 bytes) and not small (above
    # SMALL_BODY_FRACTION): ordinary, as the full walk below would find. Anything else walks.
    if (is_2xx and normal_size is not None and body_size > 256
            and body_size >= INTERSTITIAL_FRACTION * normal_size
            and not markers.site_challenge and not markers.site_block):
        return _OK
    # A 2xx of normal size is content (see INTERSTITIAL_FRACTION); anything else may be a
    # challenge or block page whatever its status (Cloudflare challenges come as 403/503).
    maybe_interstitial = not (
        is_2xx and normal_size is not None and body_size >= INTERSTITIAL_FRACTION * normal_size
    )
    # Lower-case the head only when some marker list is to be searched: it is the costly step.
    head = (
        body_head[:HEAD_BYTES].lower()
        if (maybe_interstitial or markers.site_challenge or markers.site_block)
        and body_head
        and _is_text(media)
        else b""
    )
    if head:
        found = _find(head, markers.site_challenge)
        if found is None and maybe_interstitial:
            found = _find(head, markers.challenge)
        if found is not None:
            return Classification(
                Signal.CHALLENGE, f"challenge marker {found.decode('utf-8', 'replace')!r}"
            )
    if 300 <= status < 400:
        location = field_text(headers, "location").lower().encode("utf-8", "replace")
        found = _find(location, markers.site_challenge + markers.challenge) if location else None
        if found is not None:
            return Classification(
                Signal.CHALLENGE, f"redirect to challenge {found.decode('utf-8', 'replace')!r}"
            )
    if status in _HARD_STATUSES:
        return Classification(Signal.HARD_BLOCK, _HARD_STATUSES[status])
    if status >= 500 or status < 100:
        return Classification(Signal.ERROR, f"status {status}")
    if not is_2xx or status in (204, 205) or method.upper() == "HEAD":
        return _OK
    if head:
        found = _find(head, markers.site_block)
        if found is None and maybe_interstitial:
            found = _find(head, markers.block)
        if found is not None:
            return Classification(
                Signal.SOFT_BLOCK, f"block marker {found.decode('utf-8', 'replace')!r}"
            )
    if body_size <= 0 or (body_size <= 256 and not body_head[:256].strip()):
        return Classification(Signal.SOFT_BLOCK, "empty body")
    if (
        status != 206  # a range is as small as the client asked
        and normal_size is not None
        and body_size < SMALL_BODY_FRACTION * normal_size
    ):
        share = 100 * body_size / normal_size
        return Classification(
            Signal.SOFT_BLOCK,
            f"body {body_size} B, {share:.0f}% of usual {normal_size:.0f} B"
            f" for {media or 'untyped'}",
            by_size=True,
        )
    return _OK


def classify_error(message: str) -> Classification:
    """A connection error: a reset or abrupt close is a hard block, anything else an error."""
    text = (message or "").lower()
    if any(w in text for w in _RESET_WORDS):
        return Classification(Signal.HARD_BLOCK, "connection reset")
    return Classification(Signal.ERROR, f"network error: {text[:60] or 'unknown'}")


def body_head_of(raw: bytes | None, headers: Mapping[str, str], copy: BodyCopy | None,
                 decode_whole: Callable[[], bytes]) -> tuple[bytes, int]:
    """The first HEAD_BYTES of a response's decoded body (markers are searched there) and the
    body size as it came over the wire.

    `raw`: the body as it came, None when it streamed past what the proxy holds; then `copy`
    is what was kept of it (SPEC §12: its head and size), or None (nothing kept: the size
    from the header). `headers`: lower-case names. Only the head is decoded, so a large gzip
    page costs a bounded inflate, not a full one; br and zstd decoders want the whole body
    (`decode_whole`), so a streamed one is searched as it came."""
    whole = raw is not None
    if raw is None:
        if copy is None:  # streamed, nothing kept: nothing to look at, the size from the header
            try:
                return b"", int(headers.get("content-length", "0"))
            except ValueError:
                return b"", 0
        raw, size = copy.head, copy.size
    else:
        size = len(raw)
    encoding = headers.get("content-encoding", "").strip().lower()
    if encoding in ("", "identity"):
        return raw[:HEAD_BYTES], size
    if encoding in ZLIB_CODINGS:
        decoded = decode_head(raw, encoding, HEAD_BYTES)  # a head alone decodes as far as it goes
        return (decoded[0] if decoded is not None else raw[:HEAD_BYTES]), size
    if not whole:  # br, zstd: their decoders want the whole body; the head as it came
        return raw[:HEAD_BYTES], size
    try:
        return decode_whole()[:HEAD_BYTES], size
    except Exception:  # noqa: BLE001 - an undecodable body is classified by status and size
        return raw[:HEAD_BYTES], size


class _TypeSizes:
    """The recent sizes of one content type, and their median when it has been computed."""

    # Until SIZE_SAMPLES sizes are kept (each below 4 GiB), `_sizes` is one bytes of 4-byte
    # lanes, oldest first (a learn makes the next: one exact object, 48 bytes for 3 sizes where
    # an array and its buffer are 96). Then a ring in an array ('I', wider when a size needs it;
    # `_head` the oldest), so learning one writes one slot instead of moving the other 64, and
    # a list past 64 bits. The order matters only to the stored form.
    __slots__ = ("_media", "_sizes", "_head", "_median", "_added")

    def __init__(self, media: str | None, sizes: list[int]) -> None:
        self._media = media
        self._sizes: bytes | array[int] | list[int] = _kept(sizes)
        self._head = 0
        self._median: float | None | object = _UNSET  # _UNSET: compute on the next question
        self._added = 0

    def median_size(self) -> float | None:
        """The median, or None until SIZE_MIN_SAMPLES sizes exist."""
        if self._median is _UNSET:
            sizes = self._sizes
            if (len(sizes) >> 2 if type(sizes) is bytes else len(sizes)) < SIZE_MIN_SAMPLES:
                self._median = None
            else:
                self._median = float(median_low(_lanes(sizes) if type(sizes) is bytes else sizes))
        return self._median  # type: ignore[return-value]

    def learn_size(self, size: int) -> None:
        """One more size (the oldest of SIZE_SAMPLES goes)."""
        sizes = self._sizes
        if isinstance(sizes, bytes):
            if type(size) is int and 0 <= size <= _LANE_MAX and len(sizes) < _LANES_FULL:
                self._sizes = sizes + _LANE.pack(size)
            else:
                self._sizes = _ring([*_lanes(sizes), size][-SIZE_SAMPLES:])
        else:
            try:
                if len(sizes) < SIZE_SAMPLES:
                    sizes.append(size)
                else:
                    head = self._head
                    sizes[head] = size
                    self._head = head + 1 if head < SIZE_SAMPLES - 1 else 0
            except OverflowError:  # past this width: the next one (a list past 64 bits), in order
                self._sizes = _ring([*self.sizes_in_order(), size][-SIZE_SAMPLES:], wider=sizes)  # type: ignore[arg-type]
                self._head = 0
        self._added += 1
        # Recompute the median lazily, and at most every 8 sizes: it moves slowly anyway.
        if self._added % 8 == 0 or self._median is None:
            self._median = _UNSET

    def sizes_in_order(self) -> list[int]:
        """The sizes kept, oldest first."""
        sizes, head = self._sizes, self._head
        if type(sizes) is bytes:
            return list(_lanes(sizes))
        return [*sizes[head:], *sizes[:head]]


_UNSET = object()
_LANE = struct.Struct("<I")
_LANE_MAX = 0xFFFFFFFF
_LANES_FULL = 4 * (SIZE_SAMPLES - 1)  # bytes of lanes past which a learn fills the ring


def _lanes(sizes: bytes) -> tuple[int, ...]:
    n = len(sizes) >> 2
    form = _LANE_FORMS.get(n)
    if form is None:
        form = _LANE_FORMS[n] = struct.Struct(f"<{n}I")
    return form.unpack(sizes)


_LANE_FORMS: dict[int, struct.Struct] = {}  # one per count of lanes (fewer than SIZE_SAMPLES)


def _kept(sizes: list[int]) -> bytes | array[int] | list[int]:
    """`sizes` (at most SIZE_SAMPLES, oldest first) as a _TypeSizes keeps them."""
    if len(sizes) < SIZE_SAMPLES and all(type(x) is int and 0 <= x <= _LANE_MAX for x in sizes):
        return struct.pack(f"<{len(sizes)}I", *sizes)
    return _ring(sizes)


def _ring(sizes: list[int], wider: array[int] | None = None) -> array[int] | list[int]:
    """`sizes` in the narrowest array that holds them all (wider than `wider`, if given)."""
    codes: tuple[str, ...] = ("I", "q")
    if wider is not None:
        codes = codes[codes.index(wider.typecode) + 1:]
    for code in codes:
        try:
            return array(code, sizes)
        except OverflowError:
            pass
    return list(sizes)


class SiteSizes(_TypeSizes):
    """A site's running median body size per content type (bounded: 16 types x 65 sizes): its
    first content type's sizes held in it (most sites serve one to a crawler; no media until
    a size is learnt), the others in a tuple (at most 15 more: a scan is as quick as a dict
    and ~150 bytes smaller)."""

    # SiteHealth is one (its sizes in the object a response reads anyway: one object fewer per
    # site and per response); SizeNorm is one on its own.
    __slots__ = ("_other_sizes",)

    def _no_sizes(self) -> None:
        self._media = None
        self._sizes = b""
        self._head = 0
        self._median = _UNSET
        self._added = 0
        self._other_sizes: tuple[_TypeSizes, ...] = ()

    def sizes_for(self, media: str) -> _TypeSizes | None:
        """What is learnt for `media`, if anything (one lookup for a response's question and
        its lesson: `median_size` and `learn_size` of the record)."""
        if self._media == media:
            return self
        for kept in self._other_sizes:
            if kept._media == media:
                return kept
        return None

    def _each_type(self) -> tuple[_TypeSizes, ...]:
        return () if self._media is None else (self, *self._other_sizes)

    def learn_size_of(self, media: str, size: int, kept: _TypeSizes | None = None) -> None:
        """Learn one ordinary 2xx body size (`kept`: `sizes_for(media)`, when the caller has it)."""
        if kept is None:
            kept = self.sizes_for(media)
        if kept is None:
            if self._media is None:
                kept = self
                self._media = sys.intern(media)  # "text/html": one string for all sites
            elif len(self._other_sizes) + 1 >= SIZE_MAX_TYPES:
                return
            else:
                kept = _TypeSizes(sys.intern(media), [])
                self._other_sizes = (*self._other_sizes, kept)
        kept.learn_size(size)

    def sizes_state(self) -> dict[str, Any]:
        """{content type: [sizes, oldest first]}."""
        if not self._other_sizes:
            return {} if self._media is None else {self._media: self.sizes_in_order()}
        return {kept._media: kept.sizes_in_order() for kept in self._each_type()}  # type: ignore[misc]

    def _read_sizes(self, state: Any) -> None:
        """Hold what `sizes_state` gave; raises ValueError on anything foreign."""
        if not isinstance(state, dict) or len(state) > SIZE_MAX_TYPES:
            raise ValueError("size norm: expected a mapping of at most 16 content types")
        kept: list[_TypeSizes] = []
        for media, sizes in state.items():
            if not isinstance(media, str) or not isinstance(sizes, list):
                raise ValueError("size norm: expected {content type: [sizes]}")
            for x in sizes:
                if type(x) is not int and (not isinstance(x, int) or isinstance(x, bool)) or x < 0:
                    raise ValueError("size norm: sizes must be non-negative integers")
            kept.append(_TypeSizes(media, sizes[-SIZE_SAMPLES:]))
        self._no_sizes()
        if kept:
            self._media, self._sizes = kept[0]._media, kept[0]._sizes
            self._other_sizes = tuple(kept[1:])


class SizeNorm(SiteSizes):
    """Running median body size per content type for one site, on its own."""

    __slots__ = ()

    def __init__(self) -> None:
        self._no_sizes()

    def of(self, media: str) -> _TypeSizes | None:
        """What is learnt for `media`, if anything."""
        return self.sizes_for(media)

    def normal_size(self, media: str) -> float | None:
        """The median 2xx body size for `media`, or None until SIZE_MIN_SAMPLES exist."""
        kept = self.sizes_for(media)
        # nothing learnt for this type: a median of nothing is None
        return None if kept is None else kept.median_size()

    def add(self, media: str, size: int, kept: _TypeSizes | None = None) -> None:
        """Learn one ordinary 2xx body size (`kept`: `of(media)`, when the caller has it)."""
        self.learn_size_of(media, size, kept)

    def to_state(self) -> dict[str, Any]:
        return self.sizes_state()

    @classmethod
    def from_state(cls, state: Any) -> SizeNorm:
        """Rebuild from `to_state`; raises ValueError on anything foreign."""
        norm = cls()
        norm._read_sizes(state)
        return norm
