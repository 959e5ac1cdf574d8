-- wrk through a forward proxy: absolute-form request targets (MITMPROXY-NOTES).
-- usage: wrk ... http://PROXY -s benchmarks/proxy.lua -- http://127.0.0.1:SITEPORT [paths]
-- Requests rotate over `paths` distinct pages (/page/0 .. /page/N-1), default 64.
local site, paths, n = "", 64, 0
local requests = {}

function init(args)
  site = args[1] or error("usage: -- http://host:port [paths]")
  paths = tonumber(args[2] or "64")
  local host = site:gsub("^https?://", "")
  wrk.headers["Host"] = host
  wrk.headers["User-Agent"] = "benchbot/1.0"
  for i = 0, paths - 1 do
    requests[i] = wrk.format("GET", site .. "/page/" .. i)
  end
end

function request()
  local r = requests[n % paths]
  n = n + 1
  return r
end
