"""The operator's pauses and actions on Redis (SPEC §3 `sites pause/resume/forget`, §10): a
pause taken through any proxy holds on all, kept on the server's clock; resume and forget are
announced to the others on a stream."""

from __future__ import annotations

from redis.commands.core import AsyncScript

from etiquette_proxy.state.redis_connection import RedisConnection, _text

OPERATOR_ACTIONS = "etiquette:operator:actions"  # stream: resume/forget taken through any instance
OPERATOR = "etiquette:operator"  # hash: site or host -> pause end on the server clock, -1 open-ended
# ARGV: site or host, seconds (-1: until resumed). The end is kept on the server clock.
OPERATOR_PAUSE_LUA = """
local t = redis.call('TIME')
local s = tonumber(ARGV[2])
local ends = s < 0 and -1 or tonumber(t[1]) + tonumber(t[2]) / 1000000 + s
redis.call('HSET', KEYS[1], ARGV[1], string.format('%.6f', ends))
return 1
"""
# Every pause still in force: {site, seconds left or -1, ...}; ended ones are dropped.
OPERATOR_LEFT_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  local u = tonumber(all[i + 1]) or 0
  if u < 0 then
    out[#out + 1] = all[i]; out[#out + 1] = '-1'
  elseif u > now then
    out[#out + 1] = all[i]; out[#out + 1] = string.format('%.6f', u - now)
  else
    redis.call('HDEL', KEYS[1], all[i])
  end
end
return out
"""


class OperatorCalls(RedisConnection):
    """The operator's pauses for every instance, and the actions the others took."""

    _operator_pause: AsyncScript
    _operator_left_script: AsyncScript

    def _init_operator(self) -> None:
        self._operator_pause = self._client.register_script(OPERATOR_PAUSE_LUA)
        self._operator_left_script = self._client.register_script(OPERATOR_LEFT_LUA)


    async def pause_site(self, site: str, for_s: float | None) -> None:
        """Pause `site` (a host: every port of it) for every instance, on the server clock."""
        await self._call(self._operator_pause(keys=[OPERATOR], args=[site, repr(for_s or -1.0)]))

    async def resume_site(self, site: str) -> None:
        """Lift the operator's pause of `site` (a host: every port's) for every instance."""
        for asked in await self.operator_pauses():
            if asked == site or asked.rsplit(":", 1)[0] == site:
                await self._call(self._client.hdel(OPERATOR, asked))

    async def announce_action(self, action: str, site: str) -> None:
        """Tell every other instance an operator's `resume`/`forget` of `site` (what each
        instance keeps itself, such as a health pause, is lifted by each)."""
        await self._call(self._client.xadd(OPERATOR_ACTIONS, {"from": self.instance, "action": action, "site": site},
                                           maxlen=1000, approximate=True))

    async def actions_since(self, last: str | None) -> tuple[str, list[tuple[str, str]]]:
        """(the newest id, [(action, site)] other instances announced after `last`); the first
        call (`last` None) only learns where the stream is."""
        if last is None:
            newest = await self._call(self._client.xrevrange(OPERATOR_ACTIONS, count=1))
            return (_text(newest[0][0]) if newest else "0-0"), []
        entries = await self._call(self._client.xrange(OPERATOR_ACTIONS, min=f"({last}", count=100))
        out: list[tuple[str, str]] = []
        for entry_id, fields in entries:
            last = _text(entry_id)
            f = {_text(k): _text(v) for k, v in fields.items()}
            if f.get("from") != self.instance and f.get("action") in ("resume", "forget") and f.get("site"):
                out.append((f["action"], f["site"]))
        return last, out

    async def operator_pauses(self) -> dict[str, float | None]:
        """Sites an operator paused through any instance: seconds left, None until resumed."""
        raw = await self._call(self._operator_left_script(keys=[OPERATOR]))
        out: dict[str, float | None] = {}
        for i in range(0, len(raw) - 1, 2):
            name = raw[i].decode() if isinstance(raw[i], bytes) else str(raw[i])
            left = float(raw[i + 1])
            out[name] = None if left < 0 else left
        return out
