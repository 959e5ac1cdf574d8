"""Entry for `mitmdump -s addons/etiquette.py` (the console script uses the same chain).

    mitmdump -s addons/etiquette.py --set etiquette_config=config/etiquette.yaml
"""

from __future__ import annotations

import pathlib
import sys

# mitmproxy puts this script's own folder on sys.path, not the checkout; a checkout that was not
# pip-installed still has to find the `addons` and `etiquette_proxy` packages beside each other.
_checkout = str(pathlib.Path(__file__).resolve().parent.parent)
if _checkout not in sys.path:
    sys.path.insert(0, _checkout)

from addons.chain import build_chain  # noqa: E402

addons = build_chain()
