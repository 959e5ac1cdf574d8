// axios with its own proxy support (it reads http_proxy/https_proxy); works for https:// targets
// given by name or as IP literals, where https-proxy-agent drops the servername for IPs.
import axios from "axios";

for (const url of process.argv.slice(2)) {
  const r = await axios.get(url, { validateStatus: () => true, responseType: "arraybuffer", timeout: 90000 });
  console.log(r.status, r.headers["x-etiquette-decision"] ?? "-", r.data.length);
}
