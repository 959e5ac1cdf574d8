"""Pacing (SPEC §5): the per-site token bucket and waiting line, the 429/503 contract (rate,
ceiling, pause, breaker), Retry-After and RateLimit fields."""
