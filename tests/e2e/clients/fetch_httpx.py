"""httpx with no settings of its own: HTTP(S)_PROXY and SSL_CERT_FILE from the environment."""
import sys

import httpx

with httpx.Client(timeout=90) as client:
    for url in sys.argv[1:]:
        r = client.get(url)
        print(r.status_code, r.headers.get("X-Etiquette-Decision", "-"), len(r.content))
