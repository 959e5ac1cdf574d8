"""What identity and accountability cost per request (SPEC §9, §11): signing and chaining.

In-process, no sockets. Per request:
  - Web Bot Auth signature, fresh (a new `created` every request: every request pays Ed25519,
    as at the default pace of 1 request/s per site) — the figure that counts;
  - the same site in the same second (the signer reuses the identical bytes);
  - a request carrying a price the proxy sends (`crawler-max-price` covered: never reused);
  - the bare Ed25519 sign of a signature base with `cryptography` (what the signer used before
    it moved to libsodium through PyNaCl);
  - http-message-signatures 3.x building and signing the same request (the reference the
    signer is tested against; not used per request);
  - an audit line written with its chain vs the same line written unchained (to a temp file,
    one os.write each), and the chain step alone (sha256 of previous value + line).
Target (issue 14): signing + chaining < 60 µs per request. The machine is shared, so time is
this process's CPU time (time.process_time: waiting for a core another process holds does not
count, a slower core still does); each figure is the median of --rounds rounds, spread shown.

    python benchmarks/signing.py [--requests 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _harness import check, header, median  # noqa: E402

from etiquette_proxy.audit.hash_chain import ZERO, link  # noqa: E402
from etiquette_proxy.audit.log import _ENCODER, AuditLog, audit_record  # noqa: E402
from etiquette_proxy.webbotauth import RequestSigner  # noqa: E402


def per_call_us(fn: Callable[[int], object], n: int, rounds: int) -> tuple[float, float, float]:
    """(median, min, max) µs per call over `rounds` rounds of `n` calls."""
    results = []
    for _ in range(rounds):
        start = time.process_time()
        for i in range(n):
            fn(i)
        results.append((time.process_time() - start) / n * 1e6)
    return median(results), min(results), max(results)


def record(i: int) -> dict[str, object]:
    return audit_record(ts=1_800_000_000 + i / 1000, outcome="fetched", method="GET",
                        url=f"http://127.0.0.1:8000/page/{i % 64}", site="127.0.0.1:8000", status=200,
                        upstream_status=200, waited_s=0.0, rate=1.0, reason="site answered 200",
                        client_ua="benchbot/1.0", robots="rules", bytes=1024, signed="x" * 43)


class UnchainedLog:
    """The audit writer as it was before the chain: encode, one os.write."""

    def __init__(self, path: str):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def write(self, rec: dict[str, object]) -> None:
        os.write(self.fd, (_ENCODER.encode(rec) + "\n").encode("utf-8", errors="replace"))

    def close(self) -> None:
        os.close(self.fd)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000, help="calls per round (default 2000)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds; the median is reported (default 5)")
    args = ap.parse_args()
    if not 10 <= args.requests <= 200_000 or not 1 <= args.rounds <= 50:
        ap.error("requests in 10..200000, rounds in 1..50")
    n, rounds = args.requests, args.rounds
    header("identity and accountability: signing and chaining per request")

    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.generate()
    signer = RequestSigner(key, "https://crawler.example", 300)
    base = signer.signature_base("127.0.0.1:8000", signer.signature_params(1_800_000_000, 1_800_000_300)).encode()
    fresh = per_call_us(lambda i: signer.sign("127.0.0.1:8000", 1_800_000_000 + i), n, rounds)
    same = per_call_us(lambda i: signer.sign("127.0.0.1:8000", 1_800_000_000, 1_800_000_300), n, rounds)
    price = (("crawler-max-price", "USD 0.02"),)  # SPEC §9: a price the proxy sends is covered
    priced = per_call_us(lambda i: signer.sign("127.0.0.1:8000", 1_800_000_000, 1_800_000_300, covered=price),
                         n, rounds)
    raw = per_call_us(lambda i: key.sign(base), n, rounds)
    library = per_call_us(_library_signer(key, signer), max(10, n // 10), rounds)

    records = [record(i) for i in range(256)]
    with tempfile.TemporaryDirectory(prefix="etiquette-bench-") as tmp:
        chained_log = AuditLog(os.path.join(tmp, "chained.jsonl"))
        plain_log = UnchainedLog(os.path.join(tmp, "plain.jsonl"))
        chained = per_call_us(lambda i: chained_log.write(records[i % 256]), n, rounds)
        plain = per_call_us(lambda i: plain_log.write(records[i % 256]), n, rounds)
        chained_log.close()
        plain_log.close()
    body = _ENCODER.encode(records[0])[:-1].encode()
    step = per_call_us(lambda i: link(ZERO, body), n, rounds)

    def row(label: str, figures: tuple[float, float, float]) -> None:
        med, lo, hi = figures
        print(f"  {label:<52} {med:8.1f} µs  (rounds {lo:.1f}..{hi:.1f})")

    print(f"{n} calls per round, {rounds} rounds, median CPU time per call:")
    row("Web Bot Auth signature, fresh (Ed25519 every request)", fresh)
    row("  same site, same second (identical bytes reused)", same)
    row("  with crawler-max-price covered (never reused)", priced)
    row("  the same Ed25519 sign with cryptography (was used)", raw)
    row("  http-message-signatures 3.x, same request (reference)", library)
    row("audit line with chain (encode + sha256 + os.write)", chained)
    row("  the same line unchained", plain)
    row("  chain step alone (sha256 of prev + line)", step)
    # The line difference is within the write's noise on a shared machine: count at least the step.
    chain_cost = max(step[0], chained[0] - plain[0])
    total = fresh[0] + chain_cost
    print(f"per request: signing {fresh[0]:.1f} µs + chaining {chain_cost:.1f} µs (the larger of the step "
          f"and chained - unchained) = {total:.1f} µs; the library would take "
          f"{library[0] / fresh[0]:.1f}x the signing time")
    print(check("signing + chaining < 60 µs per request", total < 60, f"{total:.1f} µs"))
    print(f"command: python benchmarks/signing.py --requests {n} --rounds {rounds}")
    return 0


def _library_signer(key: object, signer: RequestSigner) -> Callable[[int], object]:
    from http_message_signatures import HTTPMessageSigner, HTTPSignatureKeyResolver, algorithms

    class Key(HTTPSignatureKeyResolver):
        def resolve_private_key(self, key_id: str) -> object:
            return key

        def resolve_public_key(self, key_id: str) -> object:
            raise NotImplementedError

    class Message:
        def __init__(self) -> None:
            self.method, self.url = "GET", "http://127.0.0.1:8000/page/1"
            self.headers = {"Signature-Agent": signer.agent_field}

    lib = HTTPMessageSigner(signature_algorithm=algorithms.ED25519, key_resolver=Key())

    def sign(i: int) -> object:
        created = datetime.datetime.fromtimestamp(1_800_000_000 + i, datetime.UTC)
        expires = created + datetime.timedelta(seconds=300)
        lib.sign(Message(), key_id=signer.keyid, created=created, expires=expires, label="sig1", tag="web-bot-auth",
                 covered_component_ids=("@authority", '"signature-agent";key="sig1"'))
        return None

    return sign


if __name__ == "__main__":
    sys.exit(main())
