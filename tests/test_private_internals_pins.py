"""diskcache's private `Cache._sql` (revalidation/store_rows.py `_touch`) against its pin in pyproject.

The store refreshes an entry's age with one SQL UPDATE through `_sql` on diskcache 5's schema
(`Cache` table, `store_time`, `raw`); pyproject pins `diskcache>=5.6,<6` for that. This fails
when the installed diskcache is outside the pin, or when the private name or the columns the
UPDATE names are gone. (mitmproxy's: tests/addons/test_mitm_patches.py.)
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import diskcache

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def _release(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def test_diskcache_is_within_its_pin():
    deps = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["dependencies"]
    pin = next(d for d in deps if d.startswith("diskcache"))
    low, high = re.fullmatch(r"diskcache>=([\d.]+),<([\d.]+)", pin.replace(" ", "")).groups()  # type: ignore[union-attr]
    assert high == "6", f"the private _sql is verified on diskcache 5 only: keep `<6` ({pin})"
    assert _release(low) <= _release(diskcache.__version__) < _release(high), diskcache.__version__


def test_the_private_sql_and_the_columns_touch_names_are_there(tmp_path: Path):
    cache = diskcache.Cache(str(tmp_path))
    try:
        cache.set("k", b"v")
        columns = {row[1] for row in cache._sql("PRAGMA table_info(Cache)").fetchall()}  # noqa: SLF001
        assert {"key", "raw", "store_time"} <= columns
    finally:
        cache.close()
