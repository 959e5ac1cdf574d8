"""aiohttp with trust_env=True (its only way to read the proxy variables and SSL_CERT_FILE)."""
import asyncio
import sys

import aiohttp


async def main() -> None:
    async with aiohttp.ClientSession(trust_env=True, timeout=aiohttp.ClientTimeout(total=90)) as session:
        for url in sys.argv[1:]:
            async with session.get(url) as r:
                body = await r.read()
                print(r.status, r.headers.get("X-Etiquette-Decision", "-"), len(body))


asyncio.run(main())
