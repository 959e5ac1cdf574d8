"""The mitmproxy releases the patches to its private internals were verified on.

`mitm_patches.py`, `streaming.py` and `inline_hooks.py` replace functions inside mitmproxy's
HTTP layer and proxy server (`_http1`, `_upstream_proxy`, `HttpStream`, `mode_servers`,
`ConnectionHandler.hook_task`/`server_event`): names and call shapes no release
promises to keep. pyproject allows `mitmproxy>=11,<13`, so another release can be installed;
importing this module then stops start-up with an error that names both versions, rather than
patching what may have changed (STYLE: private internals are a contract with one version).
To verify a new release: install it, run `./run-tests tests/addons tests/e2e`, add it here.
"""

from __future__ import annotations

from mitmproxy.version import VERSION

VERIFIED_ON = frozenset({"11.0.2"})


class UnverifiedMitmproxy(RuntimeError):
    """The installed mitmproxy is not one the patches were verified on."""


def problem(found: str) -> str | None:
    """Why mitmproxy `found` cannot be patched, or None when it is a verified release."""
    if found in VERIFIED_ON:
        return None
    verified = ", ".join(sorted(VERIFIED_ON))
    return (f"mitmproxy {found} is installed, but etiquette-proxy patches mitmproxy's private HTTP "
            f"layer (addons/mitm_patches.py) and was verified on mitmproxy {verified} only; "
            f"install it with: pip install 'mitmproxy=={max(VERIFIED_ON)}'")


def require_verified(found: str = VERSION) -> None:
    """Raise UnverifiedMitmproxy unless mitmproxy `found` is a verified release."""
    why = problem(found)
    if why is not None:
        raise UnverifiedMitmproxy(why)


require_verified()  # on import: before mitm_patches imports the private modules it patches
