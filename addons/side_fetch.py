"""The proxy's own requests: etiquette_proxy/side_fetch.py (this name is kept for the addons
that import it from here until they import it from the core)."""

from etiquette_proxy.side_fetch import TLS_HINT, SideFetchError, SideResponse, UpstreamPath, fetch

__all__ = ["TLS_HINT", "SideFetchError", "SideResponse", "UpstreamPath", "fetch"]
