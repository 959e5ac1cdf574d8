"""Configuration: one schema, YAML with line numbers, per-site overrides (SPEC §3).

Loading is pure: `load_config(text, file=...)` returns a `Config` or raises `ConfigError`
carrying *every* problem as `FILE:LINE: key.path: what is wrong (expected …)`.
The defaults live in `SCHEMA`; `config/etiquette.yaml` documents them and a test keeps the
two identical.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from etiquette_proxy.agent_card import parse_contacts
from etiquette_proxy.payments.money import money_setting
from etiquette_proxy.robots.purposes import USES, parse_purposes
from etiquette_proxy.units import parse_duration, parse_rate, parse_size

Parser = Callable[[Any], Any]


# -- value parsers: each raises ValueError with "(expected …)" in the message ---------------

def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{value!r} is not a number (expected a number)")
    return float(value)


def positive(value: Any) -> float:
    n = _number(value)
    if n <= 0:
        raise ValueError(f"{value!r} must be > 0 (expected a positive number)")
    return n


def fraction(value: Any) -> float:
    n = _number(value)
    if not 0 < n <= 1:
        raise ValueError(f"{value!r} must be in (0, 1] (expected a fraction)")
    return n


def integer(minimum: int) -> Parser:
    def parse(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{value!r} is not a whole number (expected an integer >= {minimum})")
        if value < minimum:
            raise ValueError(f"{value!r} must be >= {minimum} (expected an integer >= {minimum})")
        return value
    return parse


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{value!r} is not a boolean (expected true or false)")
    return value


def text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{value!r} is not a non-empty string (expected text)")
    return value


def optional(parse: Parser) -> Parser:
    def parse_optional(value: Any) -> Any:
        return None if value is None else parse(value)
    return parse_optional


def choice(*options: str) -> Parser:
    def parse(value: Any) -> str:
        if value not in options:
            raise ValueError(f"{value!r} is not allowed (expected one of: {', '.join(options)})")
        return str(value)
    return parse


def sitemap_mode(value: Any) -> str:
    """revisit.sitemaps: off | read | fetch. YAML 1.1 reads an unquoted `off` as false: that
    is `off` too (and `true`, YAML's `on`, is refused: it names no mode)."""
    return choice("off", "read", "fetch")("off" if value is False else value)


def str_list(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{value!r} is not a list of strings (expected [\"a\", \"b\"])")
    return tuple(value)


def regex_list(value: Any) -> tuple[str, ...]:
    patterns = str_list(value)
    for p in patterns:
        try:
            re.compile(p)
        except re.error as e:
            raise ValueError(f"{p!r} is not a valid regular expression ({e})") from None
    return patterns


def duration_max(limit_s: float, limit_text: str) -> Parser:
    def parse(value: Any) -> float:
        seconds = parse_duration(value)
        if seconds > limit_s:
            raise ValueError(f"{value!r} is above the maximum (expected at most {limit_text})")
        return seconds
    return parse


def positive_duration(value: Any) -> float:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"{value!r} must be > 0 (expected a duration such as 2s)")
    return seconds


MIN_HEADER_BYTES = 1024


def header_limit(value: Any) -> int:
    """`listen.max_header_bytes` (SPEC §12): a size a request line and its Host always fit in."""
    size = parse_size(value)
    if size < MIN_HEADER_BYTES:
        raise ValueError(f"{value!r} is under {MIN_HEADER_BYTES} bytes (expected a size such as 64KiB; "
                         "smaller refuses ordinary requests)")
    return size


MIN_PROXYAUTH_PASSWORD = 12


def proxyauth(value: Any) -> str:
    """`listen.proxyauth` (SPEC §12): `user:password`, a real password, never mitmproxy's `any`."""
    expected = f"expected user:password with a password of at least {MIN_PROXYAUTH_PASSWORD} characters"
    if not isinstance(value, str) or not value:
        raise ValueError(f"{value!r} is not text ({expected})")
    if value.strip().lower() == "any":
        raise ValueError(f"'any' accepts every password: an open proxy ({expected})")
    user, sep, password = value.partition(":")
    if not sep or not user:
        raise ValueError(f"{'*' * len(value)} has no user name before ':' ({expected})")
    if len(password) < MIN_PROXYAUTH_PASSWORD:
        # The value is a secret: say how long, never echo it.
        raise ValueError(f"{user}:<{len(password)} characters> has too short a password ({expected})")
    return value


def redis_url(value: Any) -> str:
    """`state.url`: where the shared Redis is (SPEC §10), as redis-py reads it."""
    url = text(value)
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(f"{url!r} is not a Redis URL (expected redis://host:port/db, rediss://… or unix://…)")
    return url


def strippable_headers(value: Any) -> tuple[str, ...]:
    """`refusals.strip`: header names, none of those SPEC §7 says are never dropped."""
    from etiquette_proxy.refusals import is_essential

    names = str_list(value)
    for name in names:
        if is_essential(name):
            raise ValueError(f"{name!r} is a header SPEC §7 never drops (expected a header other than "
                             "Date, Content-*, Retry-After, Location, Cache-Control, Vary, RateLimit*)")
    return names


def canary_list(value: Any) -> tuple[dict[str, str], ...]:
    """Canaries: `[{url: ..., marker: ...}]` (SPEC §8)."""
    if not isinstance(value, list):
        raise ValueError(f"{value!r} is not a list (expected [{{url: ..., marker: ...}}])")
    out = []
    for item in value:
        if (
            not isinstance(item, dict)
            or set(item) != {"url", "marker"}
            or not all(isinstance(v, str) and v for v in item.values())
        ):
            raise ValueError(f"{item!r} is not a canary (expected {{url: ..., marker: ...}})")
        out.append(dict(item))
    return tuple(out)


def key_file(value: Any) -> str:
    """`identity.web_bot_auth.key_file`: an Ed25519 private key this user can read (SPEC §9).

    Read at load time so `check-config` and start-up name the file's problem with its line."""
    import os

    from etiquette_proxy.webbotauth import read_signing_key

    path = text(value)
    read_signing_key(os.path.expanduser(path))  # KeyFileError is a ValueError with "(expected …)"
    return path


def directory_url(value: Any) -> str:
    from etiquette_proxy.webbotauth import directory_url as parse

    return parse(value)


def signature_validity(value: Any) -> float:
    """`identity.web_bot_auth.validity`: whole seconds, 1 s to 24 h (the draft's cap)."""
    seconds = duration_max(86400, "24h")(value)
    if seconds < 1:
        raise ValueError(f"{value!r} is under a second (expected a duration from 1s to 24h)")
    return float(int(seconds))


# -- the schema ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Key:
    parse: Parser
    default: Any
    per_site: bool = False


SCHEMA: dict[str, Key] = {
    "mode": Key(choice("enforce", "observe"), "enforce"),
    "listen.host": Key(text, "127.0.0.1"),
    "listen.port": Key(integer(0), 8080),
    "listen.proxyauth": Key(optional(proxyauth), None),
    "listen.header_timeout": Key(positive_duration, 30.0),
    "listen.idle_timeout": Key(positive_duration, 300.0),
    "listen.max_header_bytes": Key(header_limit, 64 * 1024),
    "state.dir": Key(text, "~/.local/state/etiquette-proxy"),
    "state.backend": Key(choice("diskcache", "redis"), "diskcache"),
    "state.url": Key(optional(redis_url), None),
    "state.max_sites_in_memory": Key(integer(1), 100_000),
    "audit.log": Key(optional(text), None),
    "upstream.ca_file": Key(optional(text), None),
    "upstream.insecure": Key(boolean, False),
    "upstream.proxy": Key(optional(text), None),
    "upstream.timeout": Key(positive_duration, 30.0),
    "upstream.read_timeout": Key(positive_duration, 60.0),
    "upstream.idle_timeout": Key(positive_duration, 30.0),
    "upstream.max_connections": Key(integer(1), 1000),
    "limits.stream_above": Key(parse_size, 1024**2),
    "identity.user_agent": Key(optional(text), None),
    "identity.name": Key(optional(text), None),
    "identity.contacts": Key(parse_contacts, ()),
    "identity.web_bot_auth.key_file": Key(optional(key_file), None),
    "identity.web_bot_auth.signature_agent": Key(optional(directory_url), None),
    "identity.web_bot_auth.validity": Key(signature_validity, 300.0),
    "purposes": Key(parse_purposes, ()),
    "content_use": Key(optional(choice(*USES)), None),
    "payments.max_price": Key(optional(money_setting), None, per_site=True),
    "payments.daily_budget": Key(optional(money_setting), None, per_site=True),
    "robots.user_agent": Key(optional(text), None, per_site=True),
    "robots.ttl": Key(duration_max(86400, "24h"), 86400.0, per_site=True),
    "robots.timeout": Key(positive_duration, 10.0, per_site=True),
    "robots.max_bytes": Key(parse_size, 500 * 1024, per_site=True),
    "robots.max_redirects": Key(integer(0), 5, per_site=True),
    "robots.retry_min": Key(positive_duration, 30.0, per_site=True),
    "robots.retry_max": Key(positive_duration, 3600.0, per_site=True),
    "robots.keep_good_copy": Key(parse_duration, 30 * 86400.0, per_site=True),
    "robots.max_crawl_delay": Key(parse_duration, 60.0, per_site=True),
    "pacing.rate": Key(parse_rate, 1.0, per_site=True),
    "pacing.burst": Key(integer(1), 1, per_site=True),
    "pacing.max_concurrency": Key(integer(1), 2, per_site=True),
    "pacing.max_hold": Key(parse_duration, 60.0, per_site=True),
    "pacing.when_waiting": Key(choice("hold", "answer"), "hold", per_site=True),
    "pacing.group_by": Key(choice("host", "domain", "address"), "host"),
    "pacing.address_ttl": Key(positive_duration, 300.0),
    "throttle.max_retry_after": Key(positive_duration, 3600.0, per_site=True),
    "throttle.ceiling_ttl": Key(positive_duration, 3600.0, per_site=True),
    "throttle.cooldown": Key(positive_duration, 300.0, per_site=True),
    "throttle.breaker_count": Key(integer(1), 5, per_site=True),
    "throttle.breaker_window": Key(positive_duration, 60.0, per_site=True),
    "throttle.rate_floor": Key(parse_rate, 0.05, per_site=True),
    "throttle.ceiling_factor": Key(fraction, 0.8, per_site=True),
    "throttle.recovery_step": Key(parse_rate, 0.05, per_site=True),
    "store.max_body": Key(parse_size, 10 * 1024**2),
    "store.size_limit": Key(parse_size, 1024**3),
    "store.tracking_params": Key(
        str_list, ("utm_*", "gclid", "fbclid", "mc_cid", "mc_eid"), per_site=True
    ),
    "revisit.enforce": Key(boolean, False, per_site=True),
    "revisit.min_interval": Key(positive_duration, 3600.0, per_site=True),
    "revisit.max_interval": Key(positive_duration, 30 * 86400.0, per_site=True),
    "revisit.volatile_patterns": Key(regex_list, (), per_site=True),
    "revisit.sitemaps": Key(sitemap_mode, "read", per_site=True),
    "revisit.sitemap_interval": Key(positive_duration, 86400.0, per_site=True),
    "gone.ttl_410": Key(parse_duration, 7 * 86400.0, per_site=True),
    "gone.ttl_404": Key(parse_duration, 86400.0, per_site=True),
    "refusals.strip": Key(strippable_headers, (), per_site=True),
    "refusals.max_header_bytes": Key(parse_size, 1024, per_site=True),
    "runaway.retired_rate": Key(parse_rate, 1 / 60, per_site=True),
    "runaway.retired_share": Key(fraction, 0.95, per_site=True),
    "runaway.retired_window": Key(integer(1), 200, per_site=True),
    "runaway.max_distinct": Key(integer(1), 1000, per_site=True),
    "runaway.trap_action": Key(choice("log", "slow", "refuse-new"), "slow", per_site=True),
    "health.window": Key(positive_duration, 900.0, per_site=True),
    "health.min_requests": Key(integer(1), 50, per_site=True),
    "health.baseline_days": Key(integer(1), 14, per_site=True),
    "health.challenge_markers": Key(str_list, (), per_site=True),
    "health.block_markers": Key(str_list, (), per_site=True),
    "health.alert_command": Key(optional(text), None),
    "health.canaries": Key(canary_list, (), per_site=True),
    "health.canary_interval": Key(positive_duration, 300.0, per_site=True),
}

SECTIONS = sorted({k.split(".")[0] for k in SCHEMA if "." in k})

# Relations between keys, checked after each key parsed on its own: (keys, rule, message).
_RELATIONS: list[tuple[tuple[str, str], Callable[[Any, Any], bool], str]] = [
    (("robots.retry_min", "robots.retry_max"), lambda a, b: a <= b,
     "must be <= robots.retry_max (expected the first retry before the longest)"),
    (("revisit.min_interval", "revisit.max_interval"), lambda a, b: a <= b,
     "must be <= revisit.max_interval (expected floor below cap)"),
    # SPEC §10: the Redis backend needs its server, and a URL without the backend does nothing.
    (("state.backend", "state.url"), lambda backend, url: (backend == "redis") == (url is not None),
     "needs state.url set exactly when state.backend is redis (expected backend: redis with "
     "url: redis://host:port/db, or backend: diskcache without a url)"),
    # SPEC §9: a price without a budget (or the reverse) pays nothing; say so at start-up.
    (("payments.max_price", "payments.daily_budget"),
     lambda p, b: (p is None) == (b is None) and (p is None or (p.currency == b.currency and p.amount <= b.amount)),
     "needs payments.daily_budget beside it, in the same currency and not below it (expected "
     'max_price: "USD 0.05" with daily_budget: "USD 5.00")'),
]


# Keys that only mean something together: one set without the other is an error.
_TOGETHER = (("identity.web_bot_auth.key_file", "identity.web_bot_auth.signature_agent",
              "the key signs; Signature-Agent tells sites where its public key is"),)


def _check_together(pairs: Iterable[tuple[str, str, str]], values: Mapping[str, Any],
                    where: Callable[[str], tuple[str, int, str]], problems: list[ConfigProblem]) -> None:
    for a, b, why in pairs:
        for given, missing in ((a, b), (b, a)):
            if values[given] is not None and values[missing] is None:
                file, line, shown = where(given)
                problems.append(ConfigProblem(file, line, shown, f"is set without {missing} (expected both: {why})"))


# -- problems ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class ConfigProblem:
    file: str
    line: int
    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.key}: {self.message}"


class ConfigError(ValueError):
    """Every problem found in a configuration, in file order."""

    def __init__(self, problems: Iterable[ConfigProblem]):
        self.problems = sorted(problems, key=lambda p: (p.file, p.line, p.key))
        super().__init__("\n".join(str(p) for p in self.problems))


# -- the loaded configuration ----------------------------------------------------------------

class _View:
    """Attribute access over dotted keys: `view.pacing.rate`."""

    def __init__(self, lookup: Callable[[str], Any], prefix: str = ""):
        self._lookup = lookup
        self._prefix = prefix

    def __getattr__(self, name: str) -> Any:
        key = f"{self._prefix}{name}"
        if key in SCHEMA:
            return self._lookup(key)
        if key in _sections():
            return _View(self._lookup, key + ".")
        raise AttributeError(key)


class _ConfigView(_View):
    """A view of the whole config (no site): its values never change (a reload makes a new
    Config), so each attribute is looked up once and kept as a plain attribute (read on every
    request: `config.upstream.read_timeout`, `config.mode`)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # its own slots, and copy/pickle probes: never config keys
            raise AttributeError(name)
        value = super().__getattr__(name)
        if isinstance(value, _View):
            value = _ConfigView(value._lookup, value._prefix)
        self.__dict__[name] = value
        return value


_SECTIONS_OF: tuple[int, frozenset[str]] = (-1, frozenset())


def _sections() -> frozenset[str]:
    """Every dotted prefix of a SCHEMA key ("robots", "health"...): one set lookup per attribute
    instead of a scan of SCHEMA (config views are read on every request)."""
    global _SECTIONS_OF
    size, prefixes = _SECTIONS_OF
    if size != len(SCHEMA):
        parts = (k.split(".") for k in SCHEMA)
        prefixes = frozenset(".".join(p[:i]) for p in parts for i in range(1, len(p)))
        _SECTIONS_OF = (len(SCHEMA), prefixes)
    return prefixes


@dataclass(frozen=True)
class Config:
    values: Mapping[str, Any]
    sites: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def get(self, key: str, site: str | None = None) -> Any:
        """The value of `key`, for `site` when a per-site override exists."""
        if site is not None:
            override = self.site_overrides(site)
            if key in override:
                return override[key]
        return self.values[key]

    def site_overrides(self, site: str) -> Mapping[str, Any]:
        """Overrides for `host:port`, falling back to `host` alone."""
        if site in self.sites:
            return self.sites[site]
        host = site.rsplit(":", 1)[0] if not site.endswith("]") else site
        return self.sites.get(host, {})

    def for_site(self, site: str) -> Any:
        return _View(lambda k: self.get(k, site))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy/pickle probe dunders: not config keys
            raise AttributeError(name)
        # The values are fixed for the object's life: the first read of an attribute is kept
        # on the instance (frozen: past the dataclass's __setattr__), later reads are plain.
        value = getattr(_ConfigView(self.get), name)
        object.__setattr__(self, name, value)
        return value


def defaults() -> Config:
    return Config({k: key.default for k, key in SCHEMA.items()})


# -- YAML with line numbers ------------------------------------------------------------------

@dataclass
class _Located:
    value: Any
    line: int


def _compose(text: str, file: str, problems: list[ConfigProblem]) -> Any:
    """YAML to plain data where every mapping value is wrapped with its line."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark else 1
        problems.append(ConfigProblem(file, line, "(yaml)", f"not valid YAML: {getattr(e, 'problem', e)}"))
        return None
    finally:
        loader.dispose()
    if node is None:
        return {}

    def convert(n: yaml.Node) -> Any:
        if isinstance(n, yaml.MappingNode):
            out: dict[Any, _Located] = {}
            for k_node, v_node in n.value:
                k = convert(k_node)
                if not isinstance(k, (str, int, float)):
                    problems.append(ConfigProblem(file, k_node.start_mark.line + 1, str(k), "keys must be text"))
                    continue
                if str(k) in out:
                    problems.append(ConfigProblem(file, k_node.start_mark.line + 1, str(k), "duplicate key"))
                out[str(k)] = _Located(convert(v_node), k_node.start_mark.line + 1)
            return out
        if isinstance(n, yaml.SequenceNode):
            return [_plain(convert(x)) for x in n.value]
        return yaml.SafeLoader("").construct_object(n)

    return convert(node)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, _Located):
        return _plain(value.value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _unknown(key: str, candidates: Iterable[str]) -> str:
    near = difflib.get_close_matches(key, list(candidates), n=1)
    hint = f"; did you mean {near[0]}?" if near else ""
    return f"unknown key (expected one of the documented keys{hint})"


def _walk(
    tree: dict[str, _Located],
    file: str,
    prefix: str,
    display: str,
    allowed: Callable[[str], bool],
    out: dict[str, Any],
    problems: list[ConfigProblem],
) -> None:
    """Validate a (possibly nested) mapping of schema keys into `out` (dotted keys)."""
    for name, located in tree.items():
        key = f"{prefix}{name}"
        shown = f"{display}{name}"
        if key in SCHEMA and allowed(key):
            try:
                out[key] = SCHEMA[key].parse(_plain(located.value))
            except ValueError as e:
                problems.append(ConfigProblem(file, located.line, shown, str(e)))
        elif any(k.startswith(key + ".") and allowed(k) for k in SCHEMA):
            if isinstance(located.value, dict):
                _walk(located.value, file, key + ".", shown + ".", allowed, out, problems)
            elif located.value is not None:
                problems.append(ConfigProblem(
                    file, located.line, shown, f"{_plain(located.value)!r} is not a section (expected a mapping of keys)"
                ))
        else:
            problems.append(ConfigProblem(file, located.line, shown, _unknown(key, [k for k in SCHEMA if allowed(k)])))


def _check_relations(values: Mapping[str, Any], where: Callable[[str], tuple[str, int, str]],
                     explicit: Mapping[str, Any], problems: list[ConfigProblem]) -> None:
    for (a, b), ok, message in _RELATIONS:
        if (a in explicit or b in explicit) and not ok(values[a], values[b]):
            file, line, shown = where(a if a in explicit else b)
            problems.append(ConfigProblem(file, line, shown, f"{values[a]!r} {message}"))


def load_config(text: str, file: str = "<config>", overrides: Iterable[str] = ()) -> Config:
    """Parse YAML text and `--set key=value` overrides into a Config, or raise ConfigError."""
    problems: list[ConfigProblem] = []
    tree = _compose(text, file, problems) if text.strip() else {}
    values: dict[str, Any] = {}
    sites: dict[str, dict[str, Any]] = {}
    lines: dict[str, tuple[str, int, str]] = {}
    if tree is not None and not isinstance(tree, dict):
        problems.append(ConfigProblem(file, 1, "(top)", "the config must be a mapping of keys (expected key: value lines)"))
        tree = {}
    tree = tree or {}

    site_tree = tree.pop("sites", None)
    _walk(tree, file, "", "", lambda k: True, values, problems)
    for k in values:
        lines[k] = (file, _line_of(tree, k), k)
    if site_tree is not None:
        if not isinstance(site_tree.value, dict):
            if site_tree.value is not None:
                problems.append(ConfigProblem(file, site_tree.line, "sites", "is not a mapping (expected sites: {\"host:port\": {...}})"))
        else:
            for site, located in site_tree.value.items():
                shown = f'sites."{site}".'
                if not _valid_site(site):
                    problems.append(ConfigProblem(file, located.line, f'sites."{site}"', "is not a site (expected \"host\" or \"host:port\")"))
                    continue
                site_values: dict[str, Any] = {}
                if isinstance(located.value, dict):
                    _walk(located.value, file, "", shown, lambda k: SCHEMA[k].per_site, site_values, problems)
                elif located.value is not None:
                    problems.append(ConfigProblem(file, located.line, shown[:-1], "is not a mapping (expected keys such as pacing.rate)"))
                sites[site.lower()] = site_values

    for index, item in enumerate(overrides, start=1):
        _apply_override(item, index, values, sites, lines, problems)

    merged = {k: key.default for k, key in SCHEMA.items()} | values
    _check_relations(merged, lambda k: lines.get(k, (file, 1, k)), values, problems)
    _check_together(_TOGETHER, merged, lambda k: lines.get(k, (file, 1, k)), problems)
    for site, site_values in sites.items():
        def where(k: str, s: str = site) -> tuple[str, int, str]:
            return (file, 1, f'sites."{s}".{k}')
        _check_relations(merged | site_values, where, site_values, problems)

    if problems:
        raise ConfigError(problems)
    return Config(merged, sites)


def _line_of(tree: dict[str, _Located], dotted: str) -> int:
    node: Any = tree
    line = 1
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            # written as a flat key ("pacing.rate: 2") or nested; fall back to the flat form
            flat = tree.get(dotted)
            return flat.line if flat else line
        line = node[part].line
        node = node[part].value
    return line


_SITE = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9._-]+)(:\d{1,5})?$")


def _valid_site(site: str) -> bool:
    return bool(_SITE.match(site))


def _split_dotted(key: str) -> list[str]:
    """Split `sites."example.com:8080".pacing.rate` on dots outside quotes."""
    parts = re.findall(r'"[^"]*"|[^.]+', key)
    return [p.strip('"') for p in parts]


def _apply_override(item: str, index: int, values: dict[str, Any], sites: dict[str, dict[str, Any]],
                    lines: dict[str, tuple[str, int, str]], problems: list[ConfigProblem]) -> None:
    where = "--set"
    if "=" not in item:
        problems.append(ConfigProblem(where, index, item, "is not KEY=VALUE (expected e.g. pacing.rate=2)"))
        return
    key, raw = item.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    if isinstance(value, (list, dict)) and not raw.strip().startswith(("[", "{")):
        value = raw  # "-" or "a: b" on the command line mean the text itself
    parts = _split_dotted(key.strip())
    if parts and parts[0] == "sites":
        if len(parts) < 3 or not _valid_site(parts[1]):
            problems.append(ConfigProblem(where, index, key, 'is not a site key (expected sites."host:port".section.key=VALUE)'))
            return
        site, dotted = parts[1].lower(), ".".join(parts[2:])
        if dotted not in SCHEMA or not SCHEMA[dotted].per_site:
            problems.append(ConfigProblem(where, index, key, _unknown(dotted, [k for k in SCHEMA if SCHEMA[k].per_site])))
            return
        target = sites.setdefault(site, {})
    else:
        dotted = ".".join(parts)
        if dotted not in SCHEMA:
            problems.append(ConfigProblem(where, index, key, _unknown(dotted, SCHEMA)))
            return
        target = values
    try:
        target[dotted] = SCHEMA[dotted].parse(value)
        if target is values:
            lines[dotted] = (where, index, key)
    except ValueError as e:
        problems.append(ConfigProblem(where, index, key, str(e)))


def load_config_file(path: str | None, overrides: Iterable[str] = ()) -> Config:
    """Load a config file (or only defaults and overrides when `path` is None)."""
    if path is None:
        return load_config("", "<defaults>", overrides)
    try:
        with open(path, encoding="utf-8") as f:
            body = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError([ConfigProblem(path, 1, "(file)", f"cannot be read: {e}")]) from None
    return load_config(body, path, overrides)
