"""etiquette-proxy: the pure policy core (never imports mitmproxy; SPEC §2)."""

__version__ = "0.1.0"
