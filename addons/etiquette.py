"""Entry for `mitmdump -s addons/etiquette.py` (the console script uses the same chain).

    mitmdump -s addons/etiquette.py --set etiquette_config=config/etiquette.yaml
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys

try:
    from etiquette_addons.chain import build_chain
except ModuleNotFoundError:
    # Run from a checkout that was not pip-installed: import this folder as etiquette_addons.
    here = pathlib.Path(__file__).resolve().parent
    sys.path.insert(0, str(here.parent))
    spec = importlib.util.spec_from_file_location(
        "etiquette_addons", here / "__init__.py", submodule_search_locations=[str(here)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["etiquette_addons"] = module
    spec.loader.exec_module(module)
    from etiquette_addons.chain import build_chain

addons = build_chain()
