-- wrk straight at the site, rotating over the same pages as proxy.lua (origin-form targets).
-- usage: wrk ... http://127.0.0.1:SITEPORT -s benchmarks/direct.lua -- [paths]
local paths, n = 64, 0
local requests = {}

function init(args)
  paths = tonumber(args[1] or "64")
  wrk.headers["User-Agent"] = "benchbot/1.0"
  for i = 0, paths - 1 do
    requests[i] = wrk.format("GET", "/page/" .. i)
  end
end

function request()
  local r = requests[n % paths]
  n = n + 1
  return r
end
