"""The mitmproxy layer (SPEC §2): thin addons translating flows into calls on the core.

One package under one name, `addons`: the console script imports it installed, and
`mitmdump -s addons/etiquette.py` from a checkout puts the checkout on sys.path first.
"""
