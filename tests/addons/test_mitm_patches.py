"""The mitmproxy release the patches to its private internals were verified on."""

from __future__ import annotations

import pytest
from mitmproxy.version import VERSION

from addons import mitm_version


def test_the_installed_mitmproxy_is_one_the_patches_were_verified_on():
    """Fails on any other release: verify the patches on it, then add it to VERIFIED_ON."""
    assert VERSION in mitm_version.VERIFIED_ON, mitm_version.problem(VERSION)


@pytest.mark.parametrize("found", ["11.0.1", "11.1.0", "12.0.0"])
def test_another_release_stops_start_up_naming_both_versions(found: str):
    with pytest.raises(mitm_version.UnverifiedMitmproxy) as caught:
        mitm_version.require_verified(found)
    message = str(caught.value)
    assert f"mitmproxy {found} is installed" in message
    assert all(v in message for v in mitm_version.VERIFIED_ON)
    assert "pip install 'mitmproxy==" in message


def test_a_verified_release_passes():
    for found in mitm_version.VERIFIED_ON:
        mitm_version.require_verified(found)
