"""The mitmproxy layer (SPEC §2): thin addons translating flows into calls on the core.

Imported as `etiquette_addons` (pyproject maps it to this folder); `mitmdump -s
addons/etiquette.py` loads the same chain from a checkout.
"""
