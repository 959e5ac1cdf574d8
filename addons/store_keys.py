"""The flow's store key (SPEC §6 URL key), shared by gone memory, revalidation and the sitemap hooks.

Worked out once per flow, as `notes.url_key` does, but for the plainest requests (most of a
crawler's: lower-case http(s) scheme and host, a normal path, a literal query) straight from the
request's parts (`urlkey.key_of_parts`), without building `request.url` to match it again; any
other request takes `notes.url_key` itself. The same key either way
(tests/core/revalidation/test_urlkey_parts.py compares them on generated requests).
"""

from __future__ import annotations

from mitmproxy import http

from addons.notes import notes_of, url_key
from addons.runtime import Runtime
from etiquette_proxy.revalidation.site_rules import BySite, StoreRules
from etiquette_proxy.revalidation.urlkey import key_of_parts

_STORE_KEY = "etiquette_store_key"  # flow.metadata: the key, or None for a URL without one
_PLAIN_METHODS = (b"GET", b"HEAD")  # request_url builds these as the parts say (CONNECT would not)


def store_key(flow: http.HTTPFlow, rt: Runtime, rules: BySite[StoreRules]) -> str | None:
    """The flow's store key, None for a URL that has none; `rules`: the caller's store rules
    (store.tracking_params of the flow's site)."""
    metadata = flow.metadata
    if _STORE_KEY in metadata:
        return metadata[_STORE_KEY]  # type: ignore[no-any-return]
    data = flow.request.data
    key = None
    if data.method in _PLAIN_METHODS:
        tracking = rules.get(rt.config, notes_of(flow).site).tracking_params
        key = key_of_parts(data.scheme.decode("utf-8", "surrogateescape"), data.host, data.port,
                           data.path.decode("utf-8", "surrogateescape"), tracking)
    if key is None:
        key = url_key(flow, rt)
    metadata[_STORE_KEY] = key
    return key
