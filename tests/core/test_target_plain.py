"""`plainly_addressed`, the request check's fast accept, never lets through what the full
checks refuse: on generated raw targets, ports and Host spellings, whenever it says yes,
`control_bytes`, `port_problem` and `authority_mismatch` find nothing (SPEC §4, §12)."""

from __future__ import annotations

import random

from etiquette_proxy.target import authority_mismatch, control_bytes, plainly_addressed, port_problem

PIECES = [b"/", b"a", b"b/", b"%00", b"%1f", b"%7F", b"%41", b"%", b"\x00", b"\x1f", b"\x7f", b"\x80", b"\xc3\xa9",
          b"?", b"&q=1", b"..", b"//", b" ", b"\t", b"~", b";p"]
HOSTS = ["a.example", "A.Example", "a.example.", "[::1]", "::1", "127.0.0.1", "b.example", ""]
PORTS = [0, 1, 80, 443, 8080, 65535, 65536, -1]


def host_headers(host: str, port: int, rng: random.Random) -> list[str | None]:
    other = rng.choice(HOSTS)
    return [None, f"{host}:{port}", host, f"{host}:", f"{host}:{port + 1}", other, f"{other}:{port}",
            f"{host.upper()}:{port}", f" {host}:{port}", f"user@{host}:{port}", f"{host}:0{port}"]


def test_what_it_accepts_the_full_checks_accept():
    rng = random.Random(36)
    accepted = 0
    for _ in range(20_000):
        path = b"/" + b"".join(rng.choice(PIECES) for _ in range(rng.randrange(0, 6)))
        scheme = rng.choice([b"http", b"https", b"HTTP"])
        host, port, url_port = rng.choice(HOSTS), rng.choice(PORTS), rng.choice(PORTS)
        for header in host_headers(host, port, rng):
            if not plainly_addressed(path, url_port, scheme, host, port, header):
                continue
            accepted += 1
            target = path.decode("utf-8", "surrogateescape")
            assert control_bytes(target) is None, (path, header)
            assert port_problem(url_port) is None, (url_port, header)
            assert authority_mismatch(scheme.decode(), host, port, header) is None, (scheme, host, port, header)
    assert accepted > 1000  # the common requests are accepted at once
