// Independent check of the proxy's Web Bot Auth signatures (SPEC §9): npm http-message-sig
// (cloudflare/web-bot-auth) rebuilds each signature base from what the site received, and
// Node's own Ed25519 checks it against the key directory that `etiquette-proxy keygen` printed.
// Nothing here shares code with the Python signer.
//
// stdin: {"directory": {"keys": [...]}, "requests": [{"method", "target_uri", "fields": [[name, value], ...]}],
//         "required": ["crawler-exact-price", ...] (optional: more header fields each signature must cover)}
// stdout: one JSON line per request: {"ok": true, "keyid", "label", "tag", "expires", "created"} or {"ok": false, "error"}
import { component, verifySignature } from "http-message-sig";
import { createHash, createPublicKey, verify } from "node:crypto";
import { readFileSync } from "node:fs";

const input = JSON.parse(readFileSync(0, "utf8"));

// RFC 7638 thumbprint of an OKP key (RFC 8037 §A.3), computed here, not taken from the directory.
function thumbprint(jwk) {
  const canonical = JSON.stringify({ crv: jwk.crv, kty: jwk.kty, x: jwk.x });
  return createHash("sha256").update(canonical).digest("base64url");
}

const keys = new Map(input.directory.keys.map((jwk) => [thumbprint(jwk), createPublicKey({ key: jwk, format: "jwk" })]));

for (const req of input.requests) {
  const message = {
    kind: "request",
    method: req.method,
    targetUri: req.target_uri,
    fields: req.fields.map(([name, value]) => ({ name, value })),
  };
  try {
    const result = await verifySignature(message, {
      label: "sig1",
      policy: {
        algorithms: ["ed25519"],
        requiredComponents: ["@authority", component("signature-agent", { key: "sig1" }), ...(input.required || [])],
        requiredParameters: ["created", "expires", "keyid", "tag"],
        maxAge: 86400,
      },
      resolveVerifier: (candidate) => {
        const key = keys.get(candidate.parameters.keyid);
        if (!key) throw new Error(`unknown keyid ${candidate.parameters.keyid}`);
        return { algorithm: "ed25519", verify: (data, signature) => verify(null, data, key, signature) };
      },
    });
    const p = result.parameters;
    console.log(JSON.stringify({ ok: true, keyid: p.keyid, label: result.label, tag: p.tag, created: p.created, expires: p.expires }));
  } catch (error) {
    console.log(JSON.stringify({ ok: false, error: String(error && error.message ? error.message : error) }));
  }
}
