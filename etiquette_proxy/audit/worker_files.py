"""Where the workers of `run --workers N` write their audit logs, and how they are found again (SPEC §10, §11).

Each worker keeps its own file beside the configured one (`audit.jsonl` -> `audit.w1.jsonl`,
`audit.w2.jsonl`, ...), each with its own hash chain; `report`, `verify-log` and the rebuild of
pauses at start-up read them back as one set.
"""

from __future__ import annotations

import os
import re


def worker_audit_path(base: str, index: int) -> str:
    """Worker `index`'s audit file beside `base`: audit.jsonl -> audit.w1.jsonl."""
    head, name = os.path.split(base)
    stem, dot, suffix = name.rpartition(".")
    named = f"{stem}.w{index}.{suffix}" if dot and stem else f"{name}.w{index}"
    return os.path.join(head, named)


def audit_files(base: str) -> list[str]:
    """The files that make up the log at `base`: `base` itself when it exists, then every
    worker file beside it (audit.w1.jsonl, audit.w2.jsonl, ... in worker order)."""
    head, name = os.path.split(base)
    stem, dot, suffix = name.rpartition(".")
    pattern = (re.compile(re.escape(stem) + r"\.w(\d{1,3})\." + re.escape(suffix) + "$") if dot and stem
               else re.compile(re.escape(name) + r"\.w(\d{1,3})$"))
    try:
        names = os.listdir(head or ".")
    except OSError:
        names = []
    workers = sorted((int(m.group(1)), n) for n in names if (m := pattern.match(n)))
    found = [base] if os.path.exists(base) else []
    return found + [os.path.join(head, n) for _, n in workers]
