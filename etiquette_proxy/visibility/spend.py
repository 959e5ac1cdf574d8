"""What a crawl paid, from the audit lines' `charged` (SPEC §9, §11), summed exactly.

Each line of a paid request carries `charged` as the site wrote it (`USD 0.01`); the sums are
Decimals per currency and per UTC day (the day of the line's `ts`), never floats, so a report
of a thousand one-cent pages says exactly `USD 10.00`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from etiquette_proxy.payments.money import Money, plain, read_money


@dataclass
class Spend:
    """One site's (or the whole log's) spend: per UTC day, per currency."""

    paid: int = 0  # lines with a readable `charged`
    by_day: dict[str, dict[str, Decimal]] = field(default_factory=dict)

    def add(self, record: Mapping[str, Any], ts: str) -> None:
        charged = record.get("charged")
        money = read_money(charged) if isinstance(charged, str) else None
        if money is None:
            return
        self.paid += 1
        day = self.by_day.setdefault(ts[:10], {})
        day[money.currency] = day.get(money.currency, Decimal(0)) + money.amount

    def merge(self, other: Spend) -> None:
        self.paid += other.paid
        for day, sums in other.by_day.items():
            mine = self.by_day.setdefault(day, {})
            for currency, amount in sums.items():
                mine[currency] = mine.get(currency, Decimal(0)) + amount

    def total(self) -> dict[str, Decimal]:
        out: dict[str, Decimal] = {}
        for sums in self.by_day.values():
            for currency, amount in sums.items():
                out[currency] = out.get(currency, Decimal(0)) + amount
        return out

    def text(self) -> str:
        """`USD 0.04 for 4 paid requests (2026-12-03 USD 0.04)`."""
        total = ", ".join(str(Money(c, a)) for c, a in sorted(self.total().items()))
        days = "; ".join(f"{day} " + ", ".join(str(Money(c, a)) for c, a in sorted(sums.items()))
                         for day, sums in sorted(self.by_day.items()))
        return f"{total} for {self.paid} paid request(s) ({days})"

    def as_dict(self) -> dict[str, Any]:
        return {"paid": self.paid, "total": {c: plain(a) for c, a in sorted(self.total().items())},
                "by_day": {day: {c: plain(a) for c, a in sorted(sums.items())}
                           for day, sums in sorted(self.by_day.items())}}
