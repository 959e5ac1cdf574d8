"""The `etiquette-proxy` command (SPEC §3): run, check-config, ca, report, wrap, env, sites,
keygen, verify-log, card."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import signal
import sys
from collections.abc import Sequence
from typing import Any

from etiquette_proxy.config import Config, ConfigError, load_config_file

COMMANDS = ("run", "check-config", "ca", "report", "wrap", "env", "sites", "keygen", "verify-log", "card")

log = logging.getLogger("etiquette_proxy.cli")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="etiquette-proxy", description="A local forward proxy that makes any crawler polite.")
    sub = parser.add_subparsers(dest="command")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", metavar="FILE", help="YAML config (default: built-in defaults)")
        p.add_argument("--state-dir", metavar="D", help="state directory (default ~/.local/state/etiquette-proxy)")
        p.add_argument("--set", metavar="KEY=VALUE", action="append", default=[], help="override a config key")

    def run_options(run: argparse.ArgumentParser) -> None:
        run.add_argument("--audit-log", metavar="FILE",
                         help="audit log file, or - for stdout (default <state-dir>/audit.jsonl)")
        run.add_argument("--mode", choices=("enforce", "observe"),
                         help="observe: forward everything, log what would be done")

    def gate_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--require-grade", metavar="GRADE", type=_grade,
                       help="exit 3 when the conduct grade is below GRADE (A-F), naming what each site saw")
        p.add_argument("--junit", metavar="FILE",
                       help="write the conduct as JUnit XML: one test case per site, failing below "
                            "--require-grade (default B, the report's pass mark)")

    run = sub.add_parser("run", help="run the proxy (the default command)")
    common(run)
    run.add_argument("--listen-host", metavar="H", help="address to listen on (default 127.0.0.1)")
    run.add_argument("--listen-port", metavar="P", type=int, help="port to listen on, 0 for any free one (default 8080)")
    run_options(run)
    run.add_argument("--workers", metavar="N", type=int, default=1,
                     help="N proxy processes on one listening address, sharing state through Redis "
                          "(needs state.backend: redis; default 1)")
    run.add_argument("--worker", metavar="I", type=int, help=argparse.SUPPRESS)  # set by the supervisor
    run.add_argument("--handoff-fd", metavar="FD", type=int, help=argparse.SUPPRESS)  # ditto: connections come here

    check = sub.add_parser("check-config", help="validate a config file; exit 2 listing every problem")
    check.add_argument("file", metavar="FILE")
    check.add_argument("--set", metavar="KEY=VALUE", action="append", default=[])

    ca = sub.add_parser("ca", help="print the path of the CA certificate clients must trust for HTTPS")
    common(ca)

    wrap = sub.add_parser("wrap", help="run CMD through a proxy of its own; its report on stderr at the end",
                          usage="etiquette-proxy wrap [run options] [--keep-state] [--report json|text|none] "
                                "[--require-grade GRADE] [--junit FILE] -- CMD [ARGS...]")
    common(wrap)
    run_options(wrap)
    wrap.add_argument("--keep-state", action="store_true",
                      help="use the state dir (default, or --state-dir) instead of a temporary one, "
                           "so robots.txt, pauses and stored pages carry over between runs")
    wrap.add_argument("--report", choices=("text", "json", "none"), default="text",
                      help="the run's conduct report on stderr at the end (default text)")
    gate_options(wrap)
    wrap.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]")

    env = sub.add_parser("env", help="print export lines that point a shell's clients at a running proxy")
    common(env)
    env.add_argument("--proxy", metavar="URL", help="the proxy's URL (default: the one running with the state dir)")

    sites = sub.add_parser("sites", help="operator controls on a running proxy: list, pause, resume, forget")
    common(sites)
    sites.add_argument("action", nargs="?", choices=("list", "pause", "resume", "forget"), default="list")
    sites.add_argument("site", nargs="?", metavar="SITE", help="host:port, or host for every port")
    sites.add_argument("--for", dest="for_", metavar="DURATION", help="pause for this long (e.g. 90s, 10m, 2h)")
    sites.add_argument("--proxy-auth", metavar="USER:PASSWORD",
                       help="credentials for a proxy that asks for them (default: the config's listen.proxyauth)")

    report = sub.add_parser("report", help="summarise an audit log per site and grade the crawler's conduct")
    common(report)
    report.add_argument("audit_log", metavar="AUDIT_LOG", nargs="?",
                        help="audit log to read (default <state-dir>/audit.jsonl)")
    report.add_argument("--since", metavar="DURATION", help="only lines from the last DURATION (e.g. 30m, 24h, 7d)")
    report.add_argument("--site", metavar="S", help="only this site (host:port, or host for every port)")
    report.add_argument("--json", action="store_true", help="print JSON instead of the table")
    report.add_argument("--html", metavar="FILE",
                        help="write the report as one self-contained HTML page with plots to FILE")
    gate_options(report)

    keygen = sub.add_parser("keygen", help="write an Ed25519 key for Web Bot Auth and print its key directory")
    common(keygen)
    keygen.add_argument("--out", metavar="FILE", required=True, help="where to write the private key (mode 0600)")
    keygen.add_argument("--directory", action="store_true",
                        help="print a signed directory response (body and headers) to serve instead")
    keygen.add_argument("--signature-agent", metavar="URL",
                        help="https URL of the directory, or the origin serving it at the well-known path "
                             "(default identity.web_bot_auth.signature_agent)")
    keygen.add_argument("--validity", metavar="DURATION", default="7d",
                        help="how long the directory response signature holds (default 7d)")

    card = sub.add_parser("card", help="print the Signature Agent Card (JSON) generated from the config")
    common(card)
    card.add_argument("--url", metavar="URL", help="the https URL the card will be published at (its client_id)")
    verify = sub.add_parser("verify-log", help="check the audit log's hash chain; exit 1 naming the first bad line")
    common(verify)
    verify.add_argument("audit_log", metavar="AUDIT_LOG", nargs="?",
                        help="audit log to check (default <state-dir>/audit.jsonl)")
    return parser


def _grade(text: str) -> str:
    from etiquette_proxy.visibility.report import parse_grade

    try:
        return parse_grade(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _gate(args: argparse.Namespace) -> Any:
    """The conduct gate `wrap` and `report` were asked for (None: neither flag)."""
    from etiquette_proxy.visibility.report import Gate

    if args.require_grade is None and args.junit is None:
        return None
    return Gate(require=args.require_grade, junit=args.junit)


def _overrides(args: argparse.Namespace) -> list[str]:
    out = list(args.set)
    for flag, key in (("state_dir", "state.dir"), ("listen_host", "listen.host"), ("listen_port", "listen.port"),
                      ("audit_log", "audit.log"), ("mode", "mode")):
        value = getattr(args, flag, None)
        if value is not None:
            out.append(f"{key}={value}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    as_program = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS + ("-h", "--help"):
        argv.insert(0, "run")
    if as_program and argv[0] == "run":
        _optimized()
    args = _parser().parse_args(argv)
    if args.command == "check-config":
        return check_config(args.file, args.set)
    overrides = _overrides(args)
    try:
        config = load_config_file(args.config, overrides)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    if args.command in ("ca", "env", "sites", "wrap"):
        return operate(config, args)
    if args.command == "report":
        return report(config, args)
    if args.command == "keygen":
        return keygen(config, args)
    if args.command == "verify-log":
        return verify_log(config, args)
    if args.command == "card":
        return card(config, args)
    if args.workers != 1:
        return run_workers(config, args.config, overrides, args.workers)
    return run(config, args.config, overrides, worker=args.worker, handoff_fd=args.handoff_fd)


OPTIMIZE_ENV = "ETIQUETTE_PROXY_ASSERTS"  # set to 1: `run` keeps assertions (debugging)


def _optimized() -> None:
    """Become `python -O` (same PID, same arguments) before the proxy starts.

    mitmproxy's HTTP layers check their invariants with `assert` and name every task for its
    own test suite under `if __debug__` (an environment lookup per hook task): work done for
    every request that tells the crawler's operator nothing. `python -O` drops both, as the
    leanest mitmproxy benchmarks/overhead.py compares against runs; it costs the proxy about
    a sixth of its CPU per request (benchmarks/README.md, "python -O"). The asserts of this
    package only narrow types for the checker: every check that guards a promise is an `if`.
    exec keeps the process (its PID, open descriptors, signals): whoever started it still
    holds it. Not done when called as a function (tests), when already optimized, or with
    ETIQUETTE_PROXY_ASSERTS=1.
    """
    if sys.flags.optimize or os.environ.get(OPTIMIZE_ENV) == "1" or not sys.executable:
        return
    original = getattr(sys, "orig_argv", None)
    if not original:
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, "-O", *original[1:]])
    except OSError as e:  # run as we are: slower, same behaviour
        print(f"etiquette-proxy: could not restart under python -O ({e}); running with assertions",
              file=sys.stderr)


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
    _warn_key_file(config)
    print(f"{path}: ok")
    return 0


def _warn_key_file(config: Config) -> None:
    from etiquette_proxy.webbotauth import key_file_warning

    path = config.identity.web_bot_auth.key_file
    warning = key_file_warning(os.path.expanduser(path)) if path else None
    if warning:
        print(f"warning: identity.web_bot_auth.key_file: {warning}", file=sys.stderr)


def _listen_problem(config: Config, source: str) -> str | None:
    """SPEC §12: listen on loopback unless told otherwise; elsewhere requires proxy auth."""
    from etiquette_proxy.operate.startup import is_loopback

    host = config.listen.host
    if not is_loopback(host) and not config.listen.proxyauth:
        return (f"{source}:1: listen.host: {host!r} is not a loopback address "
                "(expected 127.0.0.1 or ::1, or set listen.proxyauth to user:password)")
    return None


def state_dir(config: Config) -> str:
    return os.path.abspath(os.path.expanduser(config.state.dir))


def ensure_ca(state_dir: str) -> str:
    """The CA certificate of the state dir, created the way the proxy would on first use."""
    from etiquette_proxy.operate.commands import CA_NAME

    path = os.path.join(state_dir, CA_NAME)
    if not os.path.exists(path):
        from mitmproxy import certs

        from etiquette_proxy.file_modes import private_umask, secure_tree

        private_umask()  # SPEC §12: the state dir is 0700 and its files 0600 (the CA key too)
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        certs.CertStore.from_store(state_dir, "mitmproxy", 2048)
        secure_tree(state_dir)
    return path


def operate(config: Config, args: argparse.Namespace) -> int:
    """`ca`, `env`, `sites`, `wrap`: commands that work with a proxy from outside it."""
    from etiquette_proxy.operate import commands

    state = commands.chosen_state_dir(args.state_dir, config.state.dir)
    try:
        if args.command == "ca":
            return commands.ca_command(state, sys.stderr, ensure_ca)
        if args.command == "env":
            return commands.env_command(state, args.proxy)
        if args.command == "sites":
            return _sites(commands, state, args, config)
        cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
        run_args = [f"--set={s}" for s in args.set]
        run_args += [f"--config={args.config}"] if args.config else []
        run_args += [f"--mode={args.mode}"] if args.mode else []
        run_args += [f"--audit-log={args.audit_log}"] if args.audit_log else []
        with commands.wrap_state_dir(args.state_dir, args.keep_state, config.state.dir) as (directory, kept):
            audit_log = args.audit_log or config.audit.log  # the report reads the log the proxy writes
            return commands.wrap_command(cmd, run_args, directory, kept, audit_log, args.report, sys.stderr,
                                         _gate(args))
    except commands.CommandError as e:
        print(f"etiquette-proxy {args.command}: {e}", file=sys.stderr)
        return e.code


def _sites(commands: Any, state: str, args: argparse.Namespace, config: Config) -> int:
    from etiquette_proxy.units import parse_duration

    for_s = None
    if args.for_ is not None:
        if args.action != "pause":
            raise commands.CommandError("--for goes with pause only", 2)
        try:
            for_s = parse_duration(args.for_)
        except ValueError as e:
            raise commands.CommandError(f"--for: {e}", 2) from None
    return int(commands.sites_command(state, args.action, args.site, for_s, sys.stdout,
                                      args.proxy_auth or config.listen.proxyauth))


def _audit_path(config: Config, args: argparse.Namespace, command: str) -> str | None:
    """The audit log a command reads: given, configured, or <state-dir>/audit.jsonl (the state
    dir from --state-dir, ETIQUETTE_STATE_DIR or the config)."""
    if args.audit_log is not None:
        return str(args.audit_log)
    configured = config.audit.log
    if configured == "-":
        print(f"etiquette-proxy {command}: the audit log goes to stdout in this config; name a file",
              file=sys.stderr)
        return None
    if configured:
        return os.path.expanduser(configured)
    from etiquette_proxy.operate.commands import chosen_state_dir

    return os.path.join(chosen_state_dir(getattr(args, "state_dir", None), config.state.dir), "audit.jsonl")


def keygen(config: Config, args: argparse.Namespace) -> int:
    """SPEC §3, §9: a new Ed25519 key (0600) and the JSON of its key directory."""
    import json
    import time

    from etiquette_proxy.units import parse_duration
    from etiquette_proxy.webbotauth import (
        directory_body,
        directory_url,
        jwk_thumbprint,
        public_bytes,
        signed_directory,
        write_new_key,
    )

    agent = None
    if args.directory:  # check everything before a key is written
        agent = args.signature_agent or config.identity.web_bot_auth.signature_agent
        if not agent:
            print("etiquette-proxy keygen: --directory needs --signature-agent URL (or "
                  "identity.web_bot_auth.signature_agent): the signature covers the directory's host",
                  file=sys.stderr)
            return 2
        try:
            agent = directory_url(agent)
            validity = int(parse_duration(args.validity))
        except ValueError as e:
            print(f"etiquette-proxy keygen: {e}", file=sys.stderr)
            return 2
    try:
        key = write_new_key(args.out)
    except FileExistsError:
        print(f"etiquette-proxy keygen: {args.out} exists; keygen never overwrites a key (expected a new path)",
              file=sys.stderr)
        return 2
    except OSError as e:
        print(f"etiquette-proxy keygen: cannot write {args.out}: {e.strerror}", file=sys.stderr)
        return 2
    if agent is None:
        print(directory_body([key]))
    else:
        created = int(time.time())
        body, headers = signed_directory(key, agent, created, created + validity)
        print(json.dumps({"status": 200, "headers": dict(headers), "body": body}, indent=1))
    print(f"etiquette-proxy keygen: wrote {args.out} (mode 0600), keyid {jwk_thumbprint(public_bytes(key))}; "
          "serve the directory at https://<your origin>/.well-known/http-message-signatures-directory "
          "as application/http-message-signatures-directory+json", file=sys.stderr)
    return 0


def card(config: Config, args: argparse.Namespace) -> int:
    """SPEC §9: the Signature Agent Card of this config on stdout; what it lacks on stderr."""
    import json

    from etiquette_proxy.agent_card import card_problems, signature_agent_card

    if args.url is not None and not args.url.startswith("https://"):
        print(f"etiquette-proxy card: --url {args.url!r} is not an https URL (expected the URL "
              "the card is served at, e.g. https://bot.example/bot)", file=sys.stderr)
        return 2
    made = signature_agent_card(config, args.url)
    print(json.dumps(made, indent=2))
    for problem in card_problems(made):
        print(f"etiquette-proxy card: {problem}", file=sys.stderr)
    return 0


def verify_log(config: Config, args: argparse.Namespace) -> int:
    """SPEC §3, §11: 0 when the chain holds, 1 naming the first bad line, 2 when unreadable."""
    from etiquette_proxy.audit.hash_chain import verify_file
    from etiquette_proxy.audit.worker_files import audit_files

    path = _audit_path(config, args, "verify-log")
    if path is None:
        return 2
    intact = True
    for each in audit_files(path) or [path]:  # `run --workers N`: every worker file, its own chain
        try:
            verdict = verify_file(each)
        except OSError as e:
            print(f"etiquette-proxy verify-log: cannot read {each}: {e.strerror}", file=sys.stderr)
            return 2
        print(f"{each}: {verdict.summary()}")
        intact = intact and verdict.intact
    return 0 if intact else 1


def report(config: Config, args: argparse.Namespace) -> int:
    from etiquette_proxy.audit.worker_files import audit_files
    from etiquette_proxy.operate.workers import report_merged
    from etiquette_proxy.units import parse_duration
    from etiquette_proxy.visibility.report import run_report

    since = None
    if args.since is not None:
        try:
            since = parse_duration(args.since)
        except ValueError as e:
            print(f"etiquette-proxy report: --since: {e}", file=sys.stderr)
            return 2
    path = _audit_path(config, args, "report")
    if path is None:
        return 2
    files = audit_files(path)
    if len(files) > 1 or files[:1] not in ([], [path]):  # `run --workers N` wrote one file per worker
        return report_merged(files, since_s=since, site=args.site, as_json=args.json, gate=_gate(args),
                             html=args.html)
    return run_report(path, since_s=since, site=args.site, as_json=args.json, gate=_gate(args), html=args.html)


# mitmproxy's advice when the port is taken names its own flag (`--mode regular@8082`), which
# this command line does not take.
_MITM_PORT_HINT = re.compile(r"Try specifying a different port by using `--mode [^`@]*@(\d+)`\.")


class PortHint(logging.Filter):
    """Rewrites mitmproxy's port-in-use hint into this CLI's flag."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            message = record.getMessage()
            found = _MITM_PORT_HINT.search(message)
            if found:
                record.msg = (message[:found.start()] + f"Try another port: --listen-port {found.group(1)} "
                              "(or --listen-port 0 for any free one).")
                record.args = ()
        return True


def _setup_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(PortHint())
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    from etiquette_proxy.operate.descriptors import install_exhaustion_filter

    install_exhaustion_filter()  # SPEC §12: running out of descriptors, once a second at most
    for noisy in ("mitmproxy", "asyncio", "hpack", "passlib"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def run(config: Config, config_path: str | None, overrides: list[str], worker: int | None = None,
        handoff_fd: int | None = None) -> int:
    problem = _listen_problem(config, config_path or "--listen-host")
    if problem:
        print(problem, file=sys.stderr)
        return 2
    _setup_logging()
    if worker is not None:  # one of `run --workers N`: on the supervisor's port, beside the others
        from addons.mitm_patches import share_listening_port

        share_listening_port(handoff_fd)
    try:
        return asyncio.run(_serve(config, config_path, overrides))
    except KeyboardInterrupt:
        return 0


def run_workers(config: Config, config_path: str | None, overrides: list[str], count: int) -> int:
    """SPEC §3 `run --workers N`: a supervisor and N worker processes on one listening address."""
    from addons.supervisor import supervise
    from etiquette_proxy.audit.worker_files import worker_audit_path
    from etiquette_proxy.operate.workers import workers_problem

    problem = workers_problem(count, config.state.backend) or _listen_problem(config, config_path or "--listen-host")
    if problem:
        print(f"etiquette-proxy run: {problem}", file=sys.stderr)
        return 2
    directory = state_dir(config)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    audit = config.audit.log or os.path.join(directory, "audit.jsonl")

    def command(index: int, port: int) -> list[str]:
        # Later --set wins: each worker gets the supervisor's port and its own audit file
        # (each file its own hash chain, SPEC §11); `-` stays stdout, passed on by the supervisor.
        own_audit = audit if audit == "-" else worker_audit_path(os.path.expanduser(audit), index)
        cmd = [sys.executable, *(["-O"] if sys.flags.optimize else []), "-m", "addons.cli", "run",
               "--worker", str(index)]
        cmd += [f"--config={config_path}"] if config_path else []
        cmd += [f"--set={s}" for s in overrides]
        cmd += [f"--set=state.dir={directory}", f"--set=audit.log={own_audit}",
                f"--set=listen.host={config.listen.host}", f"--set=listen.port={port}"]
        return cmd

    _setup_logging()
    return supervise(count, config.listen.host, config.listen.port, directory, command)


async def _serve(config: Config, config_path: str | None, overrides: list[str]) -> int:
    from mitmproxy import options

    from addons.chain import build_chain
    from addons.connections import ConnectionLimits
    from addons.master import ProductMaster, skip_message_typechecks
    from addons.runtime import Runtime

    skip_message_typechecks()

    opts = options.Options(listen_host=config.listen.host, listen_port=config.listen.port,
                           confdir=state_dir(config))
    master = ProductMaster(opts)  # only the mitmproxy addons the product uses (addons/master.py)
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
