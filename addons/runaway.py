"""Runaway sites: retired hosts slowed to a trickle, URL-space traps named and acted on (SPEC §7).

The guards, the restraints they put on pacing and the counts shared through Redis are the
core's RunawayService (etiquette_proxy/runaway/service.py); this addon hands it each request's
target and each answer of the site, and acts on what it says: a 429 under
`runaway.trap_action: refuse-new`, and the audit line's trap, retired and warning fields.
"""

from __future__ import annotations

from mitmproxy import http

from addons.answers import answer_locally, fail_closed
from addons.notes import notes_of, skip
from addons.runtime import Runtime
from etiquette_proxy.pacing.restraints import Restraints
from etiquette_proxy.runaway.service import RunawayService
from etiquette_proxy.target import resolve_target


class RunawayWatch:
    def __init__(self, runtime: Runtime, restraints: Restraints | None = None):
        self.rt = runtime
        self.service = RunawayService(config=lambda: runtime.config, state=lambda: runtime.state,
                                      shared=lambda: runtime.shared, restraints=restraints)
        # Pacing's table: the service writes the "retired" and "trap" restraints; pacing reads them.
        self.restraints = self.service.restraints

    def status(self, site: str) -> dict[str, object]:
        """Dashboard fields: retired or not, and the traps named on this site."""
        return self.service.status(site)

    def request(self, flow: http.HTTPFlow) -> None:
        if skip(flow):
            return
        notes = notes_of(flow)
        try:
            # SPEC §4: one URL, the target resolved. A target without a query counts nothing
            # (traps are a query's values): it goes as sent, unresolved.
            path = flow.request.path
            check = self.service.observe_request(notes.site, resolve_target(path) if "?" in path else path)
            for trap in check.declared:
                notes.extra["trap"] = trap.reason
            if check.refuse:
                if self.rt.observe:
                    notes.would_do("refused", check.reason)
                else:
                    answer_locally(flow, 429, "refused", check.reason, 60)
        except Exception as e:  # noqa: BLE001
            fail_closed(flow, "the runaway watch", e)

    def response(self, flow: http.HTTPFlow) -> None:
        notes = notes_of(flow)
        if notes.local or flow.response is None or notes.facts.get("internal"):
            return
        note = self.service.observe_answer(notes.site, notes.upstream_status or flow.response.status_code,
                                           notes.facts.get("robots_status"))
        if note is None:
            return
        notes.extra["retired" if note.retired else "revived"] = note.reason
        if note.warning:
            notes.extra["warning"] = note.warning

    def done(self) -> None:
        self.service.done()
