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
from etiquette_proxy.revalidation.recent import Recent
from etiquette_proxy.revalidation.site_rules import BySite, StoreRules
from etiquette_proxy.revalidation.store import HOT_ENTRIES
from etiquette_proxy.revalidation.urlkey import key_of_parts

_STORE_KEY = "etiquette_store_key"  # flow.metadata: the key, or None for a URL without one
_PLAIN_METHODS = (b"GET", b"HEAD")  # request_url builds these as the parts say (CONNECT would not)

# (scheme, host, port, path) as the request holds them -> (tracking params, key_of_parts' key):
# a crawler revisits the same URLs (the revalidation path), and the key of the same parts under
# the same store.tracking_params is the same string, so it is worked out (decoded, matched,
# normalised) once, not on every visit. Keyed on the raw parts (immutable bytes, str, int); the
# tracking params object is kept with the key and must be the very one in force (a new config
# brings a new one), so a key is never reused under other params. As many as the store keeps
# entries hot: the URLs revisited in turn.
_KEYS: Recent[tuple[bytes, str, int, bytes], tuple[object, str | None]] = Recent(HOT_ENTRIES)


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
        parts = (data.scheme, data.host, data.port, data.path)
        kept = _KEYS.get(parts)
        if kept is not None and kept[0] is tracking:
            key = kept[1]
        else:
            key = key_of_parts(data.scheme.decode("utf-8", "surrogateescape"), data.host, data.port,
                               data.path.decode("utf-8", "surrogateescape"), tracking)
            _KEYS.put(parts, (tracking, key))
    if key is None:
        key = url_key(flow, rt)
    metadata[_STORE_KEY] = key
    return key
