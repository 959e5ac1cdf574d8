"""What a site taught is remembered, and when it is not (SPEC §5), end to end: the real proxy,
real local sites whose own log is the truth, a real redis-server.

- a restart under other pacing settings starts from the new settings, not the old lesson;
- `etiquette-proxy sites forget` drops the lesson (the site's pause stays);
- with `state.backend: redis`, a second worker starts at the limit the first one learned.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.proxy import ETIQUETTE, clean_env
from tests.e2e.redis_server import RedisServer
from tests.e2e.sites import WindowedLimit
from tests.e2e.test_pacing import fresh, per_site  # noqa: F401 - `fresh` is a fixture

pytestmark = pytest.mark.e2e


def learn(proxy, site, prefix: str, tries: int = 6) -> list[int]:
    """Requests one after another until the site has taught its limit (one 429)."""
    with proxy.session() as s:
        return [s.get(site.url(f"/{prefix}{i}"), timeout=30).status_code for i in range(tries)]


def rates_of(proxy, prefix: str) -> list[float]:
    return [r["rate"] for r in proxy.audit() if f"/{prefix}" in r["url"] and r.get("rate") is not None]


def test_a_restart_under_other_pacing_settings_starts_from_them_not_from_the_old_lesson(start_proxy, fresh):  # noqa: F811
    site = fresh()
    windowed = WindowedLimit(site, limit=2, window=1.0, retry_after="1")
    first = start_proxy(name="learned", sets=per_site(site, pacing__rate=5))
    assert learn(first, site, "a").count(429) == 1
    assert 1.95 in rates_of(first, "a")
    assert first.stop() == 0
    # The operator lowered the rate to 1.5/s: the lesson learned at 5/s is the old config's.
    second = start_proxy(name="learned", sets=per_site(site, pacing__rate=1.5))
    assert learn(second, site, "b", tries=3) == [200] * 3
    assert set(rates_of(second, "b")) == {1.5}
    with second.session() as s:
        board = s.get("http://etiquette.proxy/api/sites", timeout=10).json()
    live = next(e for e in board["sites"] if e["site"] == f"127.0.0.1:{site.port}")["live"]
    assert "learned" not in live and "ceiling" not in live
    assert len(windowed.pauses) == 1


def test_sites_forget_drops_the_learned_limit(start_proxy, fresh):  # noqa: F811
    site = fresh()
    WindowedLimit(site, limit=2, window=1.0, retry_after="1")
    proxy = start_proxy(sets=per_site(site, pacing__rate=3))
    assert learn(proxy, site, "a").count(429) == 1
    key = f"127.0.0.1:{site.port}"
    forgot = subprocess.run([ETIQUETTE, "sites", "forget", key, "--state-dir", str(proxy.state_dir)],
                            env=clean_env(), capture_output=True, text=True, timeout=30, check=False)
    assert forgot.returncode == 0 and "learned limit forgotten" in forgot.stdout, forgot.stdout + forgot.stderr
    with proxy.session() as s:
        board = s.get("http://etiquette.proxy/api/sites", timeout=10).json()
        live = next(e for e in board["sites"] if e["site"] == key)["live"]
        assert "learned" not in live and live["rate"] == 3.0
        assert s.get(site.url("/after"), timeout=30).status_code in (200, 429)
    assert proxy.audit_for("/after")[-1]["rate"] == 3.0


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis")
    yield server
    server.stop()


def test_a_second_worker_starts_at_the_limit_the_first_learned(start_proxy, fresh, redis_server):  # noqa: F811
    site = fresh()
    windowed = WindowedLimit(site, limit=2, window=1.0, retry_after="1")
    sets = ["state.backend=redis", f"state.url={redis_server.url}", *per_site(site, pacing__rate=5)]
    first = start_proxy(name="a", sets=sets)
    assert learn(first, site, "a").count(429) == 1
    assert first.stop() == 0
    # A second worker (its own state directory: nothing on disk) on the same Redis.
    second = start_proxy(name="b", sets=sets)
    assert learn(second, site, "b", tries=8) == [200] * 8
    assert len(windowed.pauses) == 1  # the site's own log: no second lesson needed
    assert set(rates_of(second, "b")) == {1.95}
    at = sorted(a.at for a in site.arrivals if a.path.startswith("/b"))
    assert min(b - a for a, b in zip(at, at[1:], strict=False)) >= 1 / 1.95 - 0.05
