"""The `etiquette-proxy` command (SPEC §3): run, check-config, ca, report."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence

from etiquette_proxy.config import Config, ConfigError, load_config_file

COMMANDS = ("run", "check-config", "ca", "report")

log = logging.getLogger("etiquette_proxy.cli")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="etiquette-proxy", description="A local forward proxy that makes any crawler polite.")
    sub = parser.add_subparsers(dest="command")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", metavar="FILE", help="YAML config (default: built-in defaults)")
        p.add_argument("--state-dir", metavar="D", help="state directory (default ~/.local/state/etiquette-proxy)")
        p.add_argument("--set", metavar="KEY=VALUE", action="append", default=[], help="override a config key")

    run = sub.add_parser("run", help="run the proxy (the default command)")
    common(run)
    run.add_argument("--listen-host", metavar="H", help="address to listen on (default 127.0.0.1)")
    run.add_argument("--listen-port", metavar="P", type=int, help="port to listen on, 0 for any free one (default 8080)")
    run.add_argument("--audit-log", metavar="FILE", help="audit log file, or - for stdout (default <state-dir>/audit.jsonl)")
    run.add_argument("--mode", choices=("enforce", "observe"), help="observe: forward everything, log what would be done")

    check = sub.add_parser("check-config", help="validate a config file; exit 2 listing every problem")
    check.add_argument("file", metavar="FILE")
    check.add_argument("--set", metavar="KEY=VALUE", action="append", default=[])

    ca = sub.add_parser("ca", help="print the path of the CA certificate clients must trust for HTTPS")
    common(ca)

    report = sub.add_parser("report", help="summarise an audit log per site and grade the crawler's conduct")
    common(report)
    report.add_argument("audit_log", metavar="AUDIT_LOG", nargs="?",
                        help="audit log to read (default <state-dir>/audit.jsonl)")
    report.add_argument("--since", metavar="DURATION", help="only lines from the last DURATION (e.g. 30m, 24h, 7d)")
    report.add_argument("--site", metavar="S", help="only this site (host:port, or host for every port)")
    report.add_argument("--json", action="store_true", help="print JSON instead of the table")
    return parser


def _overrides(args: argparse.Namespace) -> list[str]:
    out = list(args.set)
    for flag, key in (("state_dir", "state.dir"), ("listen_host", "listen.host"), ("listen_port", "listen.port"),
                      ("audit_log", "audit.log"), ("mode", "mode")):
        value = getattr(args, flag, None)
        if value is not None:
            out.append(f"{key}={value}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS + ("-h", "--help"):
        argv.insert(0, "run")
    args = _parser().parse_args(argv)
    if args.command == "check-config":
        return check_config(args.file, args.set)
    overrides = _overrides(args)
    try:
        config = load_config_file(args.config, overrides)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    if args.command == "ca":
        return print_ca(config)
    if args.command == "report":
        return report(config, args)
    return run(config, args.config, overrides)


def check_config(path: str, overrides: Sequence[str] = ()) -> int:
    try:
        config = load_config_file(path, overrides)
        problem = _listen_problem(config, path)
        if problem:
            print(problem, file=sys.stderr)
            return 2
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    print(f"{path}: ok")
    return 0


def _listen_problem(config: Config, source: str) -> str | None:
    """SPEC §12: listen on loopback unless told otherwise; elsewhere requires proxy auth."""
    from etiquette_addons.settings import is_loopback

    host = config.listen.host
    if not is_loopback(host) and not config.listen.proxyauth:
        return (f"{source}:1: listen.host: {host!r} is not a loopback address "
                "(expected 127.0.0.1 or ::1, or set listen.proxyauth to user:password)")
    return None


def state_dir(config: Config) -> str:
    return os.path.abspath(os.path.expanduser(config.state.dir))


def print_ca(config: Config) -> int:
    from mitmproxy import certs

    from etiquette_proxy.file_modes import private_umask, secure_tree

    directory = state_dir(config)
    private_umask()  # SPEC §12: the state dir is 0700 and its files 0600
    os.makedirs(directory, mode=0o700, exist_ok=True)
    certs.CertStore.from_store(directory, "mitmproxy", 2048)  # creates the CA on first use
    secure_tree(directory)
    print(os.path.join(directory, "mitmproxy-ca-cert.pem"))
    return 0


def report(config: Config, args: argparse.Namespace) -> int:
    from etiquette_proxy.report import run_report
    from etiquette_proxy.units import parse_duration

    since = None
    if args.since is not None:
        try:
            since = parse_duration(args.since)
        except ValueError as e:
            print(f"etiquette-proxy report: --since: {e}", file=sys.stderr)
            return 2
    path = args.audit_log
    if path is None:
        configured = config.audit.log
        if configured == "-":
            print("etiquette-proxy report: the audit log goes to stdout in this config; name a file",
                  file=sys.stderr)
            return 2
        path = os.path.expanduser(configured) if configured else os.path.join(state_dir(config), "audit.jsonl")
    return run_report(path, since_s=since, site=args.site, as_json=args.json)


def _setup_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    from etiquette_addons.connections import install_exhaustion_filter

    install_exhaustion_filter()  # SPEC §12: running out of descriptors, once a second at most
    for noisy in ("mitmproxy", "asyncio", "hpack", "passlib"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def run(config: Config, config_path: str | None, overrides: list[str]) -> int:
    problem = _listen_problem(config, config_path or "--listen-host")
    if problem:
        print(problem, file=sys.stderr)
        return 2
    _setup_logging()
    try:
        return asyncio.run(_serve(config, config_path, overrides))
    except KeyboardInterrupt:
        return 0


async def _serve(config: Config, config_path: str | None, overrides: list[str]) -> int:
    from etiquette_addons.chain import build_chain
    from etiquette_addons.connections import ConnectionLimits
    from etiquette_addons.runtime import Runtime
    from mitmproxy import options
    from mitmproxy.tools.dump import DumpMaster

    opts = options.Options(listen_host=config.listen.host, listen_port=config.listen.port,
                           confdir=state_dir(config))
    master = DumpMaster(opts, with_termlog=False, with_dumper=False)
    runtime = Runtime()
    chain = build_chain(runtime)
    master.addons.add(*chain)
    # Options our addons register can only be set once they are added (MITMPROXY-NOTES).
    opts.update(etiquette_config=config_path or "", etiquette_set=overrides)
    limits = next(m for m in chain[0].members if isinstance(m, ConnectionLimits))

    loop = asyncio.get_running_loop()
    stopping: list[asyncio.Task[None]] = []

    async def drain_then_shutdown() -> None:
        # SPEC §12: held requests are answered 503 `paused` (pacing sees `stopping`), requests
        # already at a site get DRAIN_S to finish and are logged, then mitmproxy stops.
        try:
            await asyncio.sleep(0.2)
            await limits.drain()
        finally:
            master.shutdown()

    def stop() -> None:
        if runtime.stopping.is_set():
            return
        runtime.stopping.set()
        stopping.append(loop.create_task(drain_then_shutdown()))

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    await master.run()
    errorcheck = master.addons.get("errorcheck")
    return 1 if errorcheck is not None and errorcheck.logger.has_errored else 0


if __name__ == "__main__":
    sys.exit(main())
