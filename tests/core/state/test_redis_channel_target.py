"""Which `state.url`s the shared budget's pipelined connection serves (state/redis_channel.py);
the rest keep redis-py's client for every call."""

from __future__ import annotations

import pytest

from etiquette_proxy.state.redis_channel import channel_target


@pytest.mark.parametrize("url,expected", [
    ("redis://127.0.0.1:6379/0", {"host": "127.0.0.1", "port": 6379, "db": 0}),
    ("redis://:pw@10.0.0.5:7000/2", {"host": "10.0.0.5", "port": 7000, "db": 2, "password": "pw"}),
    ("redis://user:p%40ss@h:1/0", {"host": "h", "port": 1, "db": 0, "username": "user", "password": "p@ss"}),
    ("unix:///run/redis.sock?db=1", {"path": "/run/redis.sock", "db": 1}),
])
def test_a_plain_url_is_served(url, expected):
    target = channel_target(url)
    assert target is not None
    assert {k: v for k, v in target.items() if k != "connection_class"} == expected


@pytest.mark.parametrize("url", [
    "rediss://127.0.0.1:6380/0",                       # TLS: redis-py's client
    "redis://127.0.0.1:6379/0?socket_keepalive=true",  # an option this connection does not honour
    "http://127.0.0.1:6379/0",
])
def test_anything_else_keeps_redis_py(url):
    assert channel_target(url) is None
