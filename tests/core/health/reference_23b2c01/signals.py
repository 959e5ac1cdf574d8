"""Classify each response (or connection error) into one hostility signal (SPEC §8, seed 000).

The seed article's table: a *hard block* is an explicit refusal (403, 429, connection reset);
a *challenge* is a CAPTCHA or interstitial (the site suspects automation and is testing); a
*soft block* is a refusal dressed as success (2xx carrying a block page, an empty result, or a
body far below the site's normal size for that page type). Everything here is pure: the size
norm a soft block is measured against is passed in (see `SizeNorm`).
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from statistics import median_low
from typing import Any

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
    for m in markers:
        if m in haystack:
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


class _TypeSizes:
    """The recent sizes of one content type, and their median when it has been computed."""

    __slots__ = ("media", "sizes", "median", "added")

    def __init__(self, media: str, sizes: list[int]) -> None:
        self.media = media
        # 8 bytes a size in an array (a list holds a 32-byte int object per size past 256:
        # 2.7 KB at SIZE_SAMPLES, the array 0.7 KB); a size past 64 bits keeps a list.
        self.sizes: array[int] | list[int]
        try:
            self.sizes = array("q", sizes)
        except OverflowError:
            self.sizes = list(sizes)
        self.median: float | None | object = _UNSET  # _UNSET: compute on the next question
        self.added = 0

    def normal_size(self) -> float | None:
        """The median, or None until SIZE_MIN_SAMPLES sizes exist."""
        if self.median is _UNSET:
            sizes = self.sizes
            self.median = float(median_low(sizes)) if len(sizes) >= SIZE_MIN_SAMPLES else None
        return self.median  # type: ignore[return-value]

    def add(self, size: int) -> None:
        sizes = self.sizes
        try:
            sizes.append(size)
        except OverflowError:  # past 64 bits: a list from now on
            sizes = self.sizes = [*sizes, size]
        if len(sizes) > SIZE_SAMPLES:  # the last SIZE_SAMPLES sizes
            del sizes[0]
        self.added += 1
        # Recompute the median lazily, and at most every 8 sizes: it moves slowly anyway.
        if self.added % 8 == 0 or self.median is None:
            self.median = _UNSET


_UNSET = object()


class SizeNorm:
    """Running median body size per content type for one site (bounded: 16 types x 65 sizes)."""

    # One per site: nothing is allocated until the first size is learnt, then the one small
    # record of the first content type (most sites serve one to a crawler), and a tuple of them
    # from the second (at most 16: a scan is as quick as a dict and ~150 bytes smaller).
    __slots__ = ("_types",)

    def __init__(self) -> None:
        self._types: _TypeSizes | tuple[_TypeSizes, ...] | None = None

    def of(self, media: str) -> _TypeSizes | None:
        """What is learnt for `media`, if anything (one lookup for a response's question and
        its lesson: `normal_size` and `add` of the record)."""
        types = self._types
        if type(types) is _TypeSizes:
            return types if types.media == media else None
        for kept in types or ():  # type: ignore[union-attr]  # a tuple or None
            if kept.media == media:
                return kept
        return None

    def _each(self) -> tuple[_TypeSizes, ...]:
        types = self._types
        return () if types is None else (types,) if type(types) is _TypeSizes else types  # type: ignore[return-value]

    def normal_size(self, media: str) -> float | None:
        """The median 2xx body size for `media`, or None until SIZE_MIN_SAMPLES exist."""
        kept = self.of(media)
        # nothing learnt for this type: a median of nothing is None
        return None if kept is None else kept.normal_size()

    def add(self, media: str, size: int, kept: _TypeSizes | None = None) -> None:
        """Learn one ordinary 2xx body size (`kept`: `of(media)`, when the caller has it)."""
        if kept is None:
            kept = self.of(media)
        if kept is None:
            types = self._each()
            if len(types) >= SIZE_MAX_TYPES:
                return
            kept = _TypeSizes(sys.intern(media), [])  # "text/html": one string for all sites
            self._types = (*types, kept) if types else kept
        kept.add(size)

    def to_state(self) -> dict[str, Any]:
        return {kept.media: list(kept.sizes) for kept in self._each()}

    @classmethod
    def from_state(cls, state: Any) -> SizeNorm:
        """Rebuild from `to_state`; raises ValueError on anything foreign."""
        if not isinstance(state, dict) or len(state) > SIZE_MAX_TYPES:
            raise ValueError("size norm: expected a mapping of at most 16 content types")
        norm = cls()
        kept: list[_TypeSizes] = []
        for media, sizes in state.items():
            if not isinstance(media, str) or not isinstance(sizes, list):
                raise ValueError("size norm: expected {content type: [sizes]}")
            if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in sizes):
                raise ValueError("size norm: sizes must be non-negative integers")
            kept.append(_TypeSizes(media, sizes[-SIZE_SAMPLES:]))
        if kept:
            norm._types = kept[0] if len(kept) == 1 else tuple(kept)
        return norm
