"""(b') The leanest forward proxy anyone can build on mitmproxy: the floor etiquette is measured against.

A plain `mitmproxy.master.Master` with mitmproxy's own `core`, `proxyserver`, `next_layer` and
`tlsconfig` addons and nothing else. It imports no code of etiquette-proxy (neither `addons`
nor `etiquette_proxy`), so the two arms of a comparison share no code of ours: what the
etiquette arm costs over this one is the whole etiquette layer, its master included.

The benchmarks start it with `python -O`: mitmproxy checks every message's field types under
`if __debug__` (~40 µs a message here), checks `etiquette-proxy run` skips too
(addons/master.py skip_message_typechecks); with them on the floor would carry work the
product does not do.

    python -O benchmarks/_lean_master.py --port P --confdir DIR [--reverse URL]
        [--stream-large-bodies 1m] [--reuse-port]

`--reverse URL`: reverse mode in front of URL with ssl_insecure (the HTTPS arms: wrk cannot
tunnel through CONNECT). `--reuse-port`: listen with SO_REUSEPORT, so N of these processes share
one port (workers.py's lean arm: the kernel spreads the connections over them).
"""

from __future__ import annotations

import argparse
import asyncio
import functools


async def serve(args: argparse.Namespace) -> None:
    from mitmproxy import master, options
    from mitmproxy.addons import core, next_layer, proxyserver, tlsconfig

    if args.reuse_port:
        from mitmproxy.proxy import mode_servers

        mode_servers.asyncio.start_server = functools.partial(  # type: ignore[attr-defined]
            asyncio.start_server, reuse_port=True)
    opts = options.Options(listen_host="127.0.0.1", listen_port=args.port, confdir=args.confdir)
    lean = master.Master(opts)
    lean.addons.add(core.Core(), proxyserver.Proxyserver(), next_layer.NextLayer(), tlsconfig.TlsConfig())
    if args.reverse:
        opts.update(mode=[f"reverse:{args.reverse}"], ssl_insecure=True)
    if args.stream_large_bodies:
        opts.update(stream_large_bodies=args.stream_large_bodies)
    await lean.run()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--confdir", required=True)
    ap.add_argument("--reverse", metavar="URL", help="reverse mode in front of URL (TLS to the client too)")
    ap.add_argument("--stream-large-bodies", metavar="SIZE", help="mitmproxy's stream_large_bodies, e.g. 1m")
    ap.add_argument("--reuse-port", action="store_true", help="SO_REUSEPORT: share the port with others")
    asyncio.run(serve(ap.parse_args()))


if __name__ == "__main__":
    main()
