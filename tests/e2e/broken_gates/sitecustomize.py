"""Test-only: makes chosen gates of the real proxy raise, to show they fail closed (SPEC §12).

Put this directory on PYTHONPATH of a proxy process (tests/e2e/test_gates_fail_closed.py) and
name the hooks in BROKEN_GATES, e.g. `TargetCheck.request,Pacing.request`. Each named hook
raises RuntimeError for requests whose path starts with `/break/<Class>.<hook>` and runs as
usual for every other request. Nothing here is part of the product: it is not packaged, and
the proxy has no switch that does this.
"""

from __future__ import annotations

import os
from typing import Any

_named = [n for n in os.environ.get("BROKEN_GATES", "").split(",") if n]

if _named:
    from addons import chain

    def _break(class_name: str, hook: str) -> None:
        kind = getattr(chain, class_name)
        original = getattr(kind, hook)
        prefix = f"/break/{class_name}.{hook}"

        def broken(self: Any, flow: Any, *args: Any) -> Any:
            if flow.request.path.startswith(prefix):
                raise RuntimeError(f"injected into {class_name}.{hook} by the test")
            return original(self, flow, *args)

        setattr(kind, hook, broken)

    for name in _named:
        _break(*name.split("."))
