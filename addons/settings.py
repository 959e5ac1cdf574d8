"""First addon of the chain: options, config, state, audit log, and the ready line."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Sequence

from mitmproxy import ctx, exceptions, http

from addons.notes import notes_of
from addons.runtime import Runtime, expand_dir
from etiquette_proxy.audit.log import AuditLog
from etiquette_proxy.config import ConfigError, load_config_file
from etiquette_proxy.events import Broadcast
from etiquette_proxy.file_modes import private_umask, secure_tree
from etiquette_proxy.operate.startup import config_overrides, report_state_checked, settle_heap, shared_store
from etiquette_proxy.revalidation.store import ValidatorStore
from etiquette_proxy.side_fetch import UpstreamPath
from etiquette_proxy.state.local import DiskState, open_checked
from etiquette_proxy.webbotauth import key_file_warning, signer_from_config

log = logging.getLogger(__name__)

_OPTIONS = ("etiquette_config", "etiquette_set", "etiquette_state_dir", "etiquette_audit_log", "etiquette_mode")


class Settings:
    def __init__(self, runtime: Runtime, listening: Broadcast[tuple[str, int]] | None = None):
        self.rt = runtime
        # Emitted here with (host, port) once the proxy listens, before the ready line (the
        # operator controls write <state-dir>/proxy-url); chain.py connects the receivers.
        self.listening: Broadcast[tuple[str, int]] = listening if listening is not None else Broadcast("listening")
        self._loaded_key: tuple[object, ...] | None = None

    def load(self, loader) -> None:  # type: ignore[no-untyped-def]
        loader.add_option("etiquette_config", str, "", "etiquette-proxy config file (YAML).")
        loader.add_option("etiquette_set", Sequence[str], [], "etiquette-proxy config overrides, KEY=VALUE.")
        loader.add_option("etiquette_state_dir", str, "", "etiquette-proxy state directory.")
        loader.add_option("etiquette_audit_log", str, "", "etiquette-proxy audit log file, or - for stdout.")
        loader.add_option("etiquette_mode", str, "", "etiquette-proxy mode: enforce or observe.")
        loader.add_option("etiquette_ready_line", bool, True, "Print the ready line when listening.")

    def configure(self, updated: set[str]) -> None:
        if not (set(_OPTIONS) & updated) and self._loaded_key is not None:
            return
        o = ctx.options
        key = (o.etiquette_config, tuple(o.etiquette_set), o.etiquette_state_dir, o.etiquette_audit_log, o.etiquette_mode)
        if key == self._loaded_key:
            return
        overrides = config_overrides(o.etiquette_set, o.etiquette_state_dir, o.etiquette_audit_log, o.etiquette_mode)
        try:
            config = load_config_file(o.etiquette_config or None, overrides)
        except ConfigError as e:
            raise exceptions.OptionsError(str(e)) from None
        self._loaded_key = key
        self._open(config)

    def _open(self, config) -> None:  # type: ignore[no-untyped-def]
        rt = self.rt
        signer = self._signer(config)  # first: a bad key changes nothing
        if rt.audit is not None:
            rt.audit.close()
        rt.state.close()
        if rt.store is not None:
            rt.store.close()
        rt.config = config
        rt.state_dir = expand_dir(config.state.dir)
        private_umask()  # SPEC §12: every file made from here on (SQLite, stored bodies) is 0600
        os.makedirs(rt.state_dir, mode=0o700, exist_ok=True)
        # SPEC §12: each SQLite store checked first; a damaged one moved aside, a fresh one used.
        rt.state, moved_state = open_checked(os.path.join(rt.state_dir, "state"), DiskState)
        rt.shared = shared_store(config, rt.shared)
        rt.store, moved_store = open_checked(os.path.join(rt.state_dir, "store"),
                                             lambda d: ValidatorStore.from_config(config, d))
        secure_tree(rt.state_dir)  # an existing dir and files made under an earlier umask
        audit_path = config.audit.log or os.path.join(rt.state_dir, "audit.jsonl")
        rt.audit = AuditLog(audit_path if audit_path == "-" else os.path.expanduser(audit_path))
        report_state_checked([m for m in (moved_state, moved_store) if m is not None], rt.state, rt.audit.path,
                             config, rt.record)
        rt.upstream = UpstreamPath(ca_file=config.upstream.ca_file, insecure=config.upstream.insecure,
                                   proxy=config.upstream.proxy, signer=signer)
        # MITMPROXY-NOTES: the eager strategy opens TCP+TLS to the site even for requests we
        # answer locally; lazy means a refused request never touches the site.
        changes: dict[str, object] = {"connection_strategy": "lazy", "confdir": rt.state_dir}
        changes["ssl_insecure"] = config.upstream.insecure
        if config.upstream.ca_file:
            changes["ssl_verify_upstream_trusted_ca"] = config.upstream.ca_file
        if config.upstream.proxy:
            changes["mode"] = [f"upstream:{config.upstream.proxy}"]
        if config.listen.proxyauth:
            changes["proxyauth"] = config.listen.proxyauth
        current = {k: getattr(ctx.options, k) for k in changes}
        if current != changes:
            ctx.options.update(**changes)
        log.info("etiquette-proxy: mode %s, state in %s, audit log %s", config.mode, rt.state_dir, audit_path)

    @staticmethod
    def _signer(config):  # type: ignore[no-untyped-def]
        """SPEC §9: the Web Bot Auth signer, or None; a key that cannot be used stops start-up."""
        try:
            signer = signer_from_config(config)
        except ValueError as e:  # KeyFileError names the file, never the key
            raise exceptions.OptionsError(f"identity.web_bot_auth: {e}") from None
        if signer is not None:
            warning = key_file_warning(os.path.expanduser(config.identity.web_bot_auth.key_file))
            if warning:
                log.warning("identity.web_bot_auth.key_file: %s", warning)
            log.info("Web Bot Auth: signing every request with keyid %s (Signature-Agent %s)",
                     signer.keyid, signer.signature_agent)
        return signer

    def running(self) -> None:
        # After every member's running hook and the ready line: start-up is not delayed by it.
        asyncio.get_running_loop().call_soon(settle_heap)
        server = ctx.master.addons.get("proxyserver")
        addrs = server.listen_addrs() if server else []
        for host, port, *_ in addrs[:1]:
            self.listening.emit((host, port))
            if not ctx.options.etiquette_ready_line:
                return
            shown = f"[{host}]" if ":" in host else host
            sys.stdout.write(f"etiquette-proxy listening on http://{shown}:{port}\n")
            sys.stdout.flush()

    def request(self, flow: http.HTTPFlow) -> None:
        notes_of(flow)  # start the clock for waited_s

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        notes = notes_of(flow)
        if not notes.local and flow.response is not None and notes.upstream_status is None:
            notes.upstream_status = flow.response.status_code

    def done(self) -> None:
        if self.rt.audit is not None:
            self.rt.audit.close()
        self.rt.state.close()
        if self.rt.store is not None:
            self.rt.store.close()
