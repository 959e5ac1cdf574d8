// Node 20/22 built-in fetch ignores the proxy variables: undici's EnvHttpProxyAgent reads them
// (README client table); the CA comes from NODE_EXTRA_CA_CERTS, read at start.
import { EnvHttpProxyAgent, setGlobalDispatcher } from "undici";

setGlobalDispatcher(new EnvHttpProxyAgent());
for (const url of process.argv.slice(2)) {
  const r = await fetch(url);
  const body = new Uint8Array(await r.arrayBuffer());
  console.log(r.status, r.headers.get("x-etiquette-decision") ?? "-", body.length);
}
