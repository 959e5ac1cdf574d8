"""The values one query parameter took on one path (runaway/traps.py): an exact set of hashes
while small, then a fixed-size Bloom filter and a HyperLogLog, so a site's memory stays bounded
however many values a URL-space trap brings (SPEC §7)."""

from __future__ import annotations

import base64
import hashlib
import math
from collections.abc import Iterable
from typing import Any


def value_hash(value: str) -> int:
    """A stable 64-bit hash of a parameter value (stable across processes, so persistable)."""
    data = value.encode("utf-8", "surrogatepass")
    return _from_bytes(_blake2b(data, digest_size=8).digest(), "big")


_blake2b, _from_bytes = hashlib.blake2b, int.from_bytes  # per request value: one lookup, not two


class ValueSet:
    """Values seen: an exact set of hashes while small, then a fixed-size Bloom filter.

    A Bloom filter can only err towards "seen": a new value taken for old makes the detector
    count fewer new values (slower to call a trap) and lets it through under refuse-new. Both
    errors are on the side of the crawl, never a wider refusal. Past the filter's design load
    (`bits / 40` values) the miss count falls behind, so a HyperLogLog (1 KiB, about ±3 %)
    keeps the distinct count honest for status and report.
    """

    __slots__ = ("_bits", "_bloom", "_exact", "_hll", "_limit")
    _K = 7
    _HLL_P = 10  # 1,024 registers: standard error 1.04 / sqrt(1024), about 3 %

    def __init__(self, exact_limit: int, bloom_bits: int) -> None:
        self._exact: set[int] | None = set()
        self._bloom: bytearray | None = None
        self._hll: bytearray | None = None
        self._bits = bloom_bits
        self._limit = exact_limit

    def _positions(self, h: int) -> Iterable[int]:
        h1, h2 = h & 0xFFFFFFFF, (h >> 32) | 1  # Kirsch-Mitzenmacher double hashing
        return ((h1 + i * h2) % self._bits for i in range(self._K))

    def __contains__(self, h: int) -> bool:
        if self._exact is not None:
            return h in self._exact
        bloom = self._bloom
        assert bloom is not None
        return all(bloom[p >> 3] & (1 << (p & 7)) for p in self._positions(h))

    def add(self, h: int) -> None:
        """Remember a value (idempotent)."""
        if self._exact is not None:
            self._exact.add(h)
            if len(self._exact) <= self._limit:
                return
            hashes, self._exact = self._exact, None
            self._bloom = bytearray(self._bits // 8)
            self._hll = bytearray(1 << self._HLL_P)
            for old in hashes:
                self._set_bits(old)
            return
        self._set_bits(h)

    def _set_bits(self, h: int) -> None:
        bloom, hll = self._bloom, self._hll
        assert bloom is not None and hll is not None
        for p in self._positions(h):
            bloom[p >> 3] |= 1 << (p & 7)
        rest_bits = 64 - self._HLL_P
        index, rest = h >> rest_bits, h & ((1 << rest_bits) - 1)
        rank = rest_bits - rest.bit_length() + 1
        hll[index] = max(hll[index], rank)

    @property
    def design_load(self) -> int:
        """Values the Bloom filter holds with a negligible false 'seen' rate."""
        return self._bits // 40

    def estimate(self) -> int | None:
        """HyperLogLog distinct estimate once the exact set is gone, else None."""
        if self._hll is None:
            return None
        m = len(self._hll)
        alpha = 0.7213 / (1 + 1.079 / m)
        raw = alpha * m * m / sum(2.0 ** -r for r in self._hll)
        zeros = self._hll.count(0)
        if raw <= 2.5 * m and zeros:
            raw = m * math.log(m / zeros)  # small-range correction (linear counting)
        return round(raw)

    @property
    def size_bytes(self) -> int:
        """Rough memory held: 8 bytes per exact hash, or the two fixed sketches."""
        if self._exact is not None:
            return len(self._exact) * 8
        return len(self._bloom or b"") + len(self._hll or b"")

    def to_state(self) -> dict[str, Any]:
        if self._exact is not None:
            return {"exact": sorted(self._exact)}
        return {"bits": self._bits,
                "bloom": base64.b64encode(bytes(self._bloom or b"")).decode(),
                "hll": base64.b64encode(bytes(self._hll or b"")).decode()}

    @classmethod
    def from_state(cls, state: object, exact_limit: int, bloom_bits: int) -> ValueSet:
        if isinstance(state, dict) and isinstance(state.get("exact"), list):
            hashes = state["exact"]
            if not all(isinstance(h, int) and not isinstance(h, bool) and 0 <= h < 2**64
                       for h in hashes):
                raise ValueError("value set: hashes must be 64-bit integers")
            out = cls(max(exact_limit, len(hashes)), bloom_bits)
            out._exact = set(hashes)
            return out
        if isinstance(state, dict) and isinstance(state.get("bloom"), str) \
                and isinstance(state.get("hll"), str):
            bits = state.get("bits")
            try:
                bloom = base64.b64decode(state["bloom"], validate=True)
                hll = base64.b64decode(state["hll"], validate=True)
            except ValueError:
                raise ValueError("value set: sketches are not base64") from None
            if not isinstance(bits, int) or bits < 8 or bits > 1 << 26 or len(bloom) * 8 != bits:
                raise ValueError("value set: bloom size does not match its bits")
            if len(hll) != 1 << cls._HLL_P or max(hll) > 64 - cls._HLL_P + 1:
                raise ValueError("value set: not a HyperLogLog sketch")
            out = cls(exact_limit, bits)
            out._exact, out._bloom, out._hll = None, bytearray(bloom), bytearray(hll)
            return out
        raise ValueError(f"not a value set: {state!r:.80}")

