"""Pages with validators for revalidation tests: a site that answers conditionals like a real one."""

from __future__ import annotations

import email.utils
import gzip as gzip_module
import hashlib
import threading
from dataclasses import dataclass, field

from tests.e2e.sites import Answer, Arrival, Site


@dataclass
class Page:
    body: bytes
    etag: bool = True
    last_modified: bool = True
    headers: dict[str, str] = field(default_factory=dict)
    gzip: bool = False
    version: int = 1
    etag_value: str | None = None  # a fixed (possibly hostile) ETag instead of a hash

    def etag_of(self) -> str:
        return self.etag_value or '"' + hashlib.sha256(self.body).hexdigest()[:16] + '"'

    def modified_of(self) -> str:
        # A fixed date per version: Last-Modified changes exactly when the page does.
        return email.utils.formatdate(1_700_000_000 + self.version * 3600, usegmt=True)


class Pages:
    """`pages.add(site, "/a", b"...")`; `pages.change("/a", b"...")`; counts what was sent."""

    def __init__(self) -> None:
        self.pages: dict[str, Page] = {}
        self._lock = threading.Lock()
        self.sent_200 = 0
        self.sent_304 = 0
        self.body_bytes = 0

    def add(self, site: Site, path: str, body: bytes, **kw: object) -> Page:
        page = Page(body, **kw)  # type: ignore[arg-type]
        self.pages[path] = page
        site.route(path, lambda arrival, path=path: self.answer(path, arrival))
        return page

    def change(self, path: str, body: bytes) -> None:
        page = self.pages[path]
        page.body = body
        page.version += 1

    def answer(self, path: str, arrival: Arrival) -> Answer:
        page = self.pages[path]
        validators: dict[str, str] = {}
        if page.etag:
            validators["ETag"] = page.etag_of()
        if page.last_modified:
            validators["Last-Modified"] = page.modified_of()
        inm = arrival.headers.get("if-none-match")
        ims = arrival.headers.get("if-modified-since")
        # RFC 9110 §13.2.2: If-None-Match first; If-Modified-Since only without it.
        if inm is not None and page.etag:
            fresh = inm.strip() in (validators["ETag"], "*")
        elif ims is not None and page.last_modified:
            fresh = ims.strip() == validators["Last-Modified"]
        else:
            fresh = False
        if fresh and arrival.method in ("GET", "HEAD"):
            with self._lock:
                self.sent_304 += 1
            return Answer(304, b"", {**validators, "Cache-Control": "max-age=0"})
        body = page.body
        headers = {"Content-Type": "text/html", **validators, **page.headers}
        if page.gzip and "gzip" in arrival.headers.get("accept-encoding", ""):
            body = gzip_module.compress(body, mtime=0)
            headers["Content-Encoding"] = "gzip"
            headers["Vary"] = "Accept-Encoding"
        elif page.gzip:
            headers["Vary"] = "Accept-Encoding"
        with self._lock:
            self.sent_200 += 1
            if arrival.method != "HEAD":
                self.body_bytes += len(body)
        return Answer(200, body, headers)
