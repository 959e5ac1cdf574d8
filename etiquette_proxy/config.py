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

# The parsers, the schema and the YAML reader live in their own modules; everything they
# define is re-exported here, where the rest of the code imports it from.
from etiquette_proxy.config_schema import _RELATIONS, _TOGETHER, SCHEMA, SECTIONS, Key  # noqa: F401
from etiquette_proxy.config_values import (  # noqa: F401 (re-exported)
    MIN_HEADER_BYTES,
    MIN_PROXYAUTH_PASSWORD,
    Parser,
    boolean,
    canary_list,
    choice,
    directory_url,
    duration_max,
    fraction,
    header_limit,
    integer,
    key_file,
    optional,
    positive,
    positive_duration,
    proxyauth,
    redis_url,
    regex_list,
    signature_validity,
    sitemap_mode,
    str_list,
    strippable_headers,
    text,
)
from etiquette_proxy.config_yaml import ConfigError, ConfigProblem, _compose, _line_of, _Located, _plain  # noqa: F401


def _check_together(pairs: Iterable[tuple[str, str, str]], values: Mapping[str, Any],
                    where: Callable[[str], tuple[str, int, str]], problems: list[ConfigProblem]) -> None:
    for a, b, why in pairs:
        for given, missing in ((a, b), (b, a)):
            if values[given] is not None and values[missing] is None:
                file, line, shown = where(given)
                problems.append(ConfigProblem(file, line, shown, f"is set without {missing} (expected both: {why})"))


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
