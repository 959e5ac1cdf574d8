"""`RedisShared`: everything the proxies on one Redis share (SPEC §10, `state.backend: redis`).

One connection (redis_connection.py: every call bounded, failing closed, said once) carrying
three groups of calls, each in its own module:
- redis_leases.py: the shared budget, the 429 contract and this process's concurrency leases;
- redis_operator.py: the operator's pauses and actions;
- redis_records.py: one fetch for all (robots.txt), per-URL records, trap counts, health windows.
"""

from __future__ import annotations

from etiquette_proxy.state.redis_connection import CALL_TIMEOUT_S, RedisConnection, SharedStateUnavailable
from etiquette_proxy.state.redis_leases import PREFIX, SharedPacingCalls
from etiquette_proxy.state.redis_operator import OperatorCalls
from etiquette_proxy.state.redis_records import SharedRecordCalls
from etiquette_proxy.state.shared_pacing import LEASE_RENEW_S, LEASE_TTL_S

__all__ = ["CALL_TIMEOUT_S", "PREFIX", "RedisShared", "SharedStateUnavailable"]


class RedisShared(SharedPacingCalls, OperatorCalls, SharedRecordCalls):
    """On one Redis: the per-site shared reservation, 429 contract and concurrency leases, the
    operator's pauses, and the values, locks and records that let one instance fetch for all."""

    def __init__(self, url: str, lease_ttl_s: float = LEASE_TTL_S, renew_s: float = LEASE_RENEW_S):
        RedisConnection.__init__(self, url)
        self._init_pacing(lease_ttl_s, renew_s)
        self._init_operator()
        self._init_records()
