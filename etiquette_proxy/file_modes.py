"""State dir 0700, its files 0600, the audit log 0600, whatever the umask (SPEC §12).

Stored pages, pauses, the CA key and the audit log are the user's crawl: nobody else on the
machine reads them. A directory that already exists keeps whatever mode it was made with, and
SQLite (diskcache) creates its files with the process umask, so both are fixed here: once over
the tree at start, and through the umask for every file created afterwards.
"""

from __future__ import annotations

import logging
import os
import stat

log = logging.getLogger(__name__)

DIR_MODE = 0o700
FILE_MODE = 0o600
PRIVATE_UMASK = 0o077
# The CA certificate (public by design: clients must read it) and mitmproxy's public variants.
PUBLIC_FILES = frozenset({"mitmproxy-ca-cert.pem", "mitmproxy-ca-cert.cer", "mitmproxy-ca-cert.p12",
                          "mitmproxy-dhparam.pem"})


def private_umask() -> None:
    """Files the process creates from now on are 0600, directories 0700 (process-wide)."""
    os.umask(PRIVATE_UMASK)


def secure_tree(directory: str) -> int:
    """Make `directory` 0700 and everything under it 0700/0600 (public CA files excepted);
    the number of modes changed. Symlinks are not followed."""
    changed = _chmod(directory, DIR_MODE)
    for root, dirs, files in os.walk(directory):
        for name in dirs:
            changed += _chmod(os.path.join(root, name), DIR_MODE)
        for name in files:
            if name not in PUBLIC_FILES:
                changed += _chmod(os.path.join(root, name), FILE_MODE)
    return changed


def secure_file(path: str) -> int:
    """Make one file 0600 (the audit log, wherever it is); 1 when its mode changed."""
    return _chmod(path, FILE_MODE)


def _chmod(path: str, mode: int) -> int:
    try:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode) or stat.S_IMODE(st.st_mode) == mode:
            return 0
        os.chmod(path, mode)
        return 1
    except FileNotFoundError:
        return 0  # removed meanwhile (diskcache culls)
    except OSError as e:
        log.warning("could not make %s mode %o: %s", path, mode, e)
        return 0
