"""Benchmark arms on `etiquette-proxy run`'s own mitmproxy master where `run` itself cannot go.

    python benchmarks/_product_master.py --port P --confdir DIR                 # (b') lean mitmproxy
    python benchmarks/_product_master.py --port P --confdir DIR --chain STATE \\
        --reverse https://127.0.0.1:PORT [--set KEY=VALUE ...]                   # (c) HTTPS, reverse mode

Without `--chain`: `run`'s master (addons/master.py: only the mitmproxy addons the product
uses, hook table) with no etiquette addon: what the chain itself adds over the mitmproxy that
`run` runs, beside what it adds over bare `mitmdump` (whose 34 default addons cost more than
the chain: benchmarks/README.md). With `--chain STATE`: `build_chain()` on that master, as
`run` builds it; with `--reverse URL` in reverse mode in front of an HTTPS site, because wrk
cannot tunnel through CONNECT (with keep-alive the CONNECT is once per connection, so reverse
mode measures the same per-request work). A checkout from before addons/master.py existed
(`--before`) gets what its `run` built: DumpMaster without termlog and dumper.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any


def master_for(opts: Any) -> Any:
    try:
        from addons.master import ProductMaster, skip_message_typechecks
    except ImportError:  # a checkout before the lean master: what its `run` used
        from mitmproxy.tools.dump import DumpMaster
        return DumpMaster(opts, with_termlog=False, with_dumper=False)
    skip_message_typechecks()  # as `run` does
    return ProductMaster(opts)


async def serve(args: argparse.Namespace) -> None:
    from mitmproxy import options

    opts = options.Options(listen_host="127.0.0.1", listen_port=args.port, confdir=args.confdir)
    if args.reverse:
        opts.update(mode=[f"reverse:{args.reverse}"], ssl_insecure=True)
    master = master_for(opts)
    if args.chain:
        from addons.chain import build_chain
        from addons.runtime import Runtime

        master.addons.add(*build_chain(Runtime()))
        opts.update(etiquette_state_dir=args.chain, etiquette_set=list(args.set), etiquette_ready_line=False)
    await master.run()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--confdir", required=True)
    ap.add_argument("--chain", metavar="STATE_DIR", help="add the etiquette chain, state in STATE_DIR")
    ap.add_argument("--reverse", metavar="URL", help="reverse mode in front of URL (TLS to the client too)")
    ap.add_argument("--set", action="append", default=[], help="an etiquette config override (with --chain)")
    asyncio.run(serve(ap.parse_args()))


if __name__ == "__main__":
    main()
