"""Config: defaults, units, per-site overrides, and every kind of error message."""

from __future__ import annotations

from pathlib import Path

import pytest

from etiquette_proxy.config import SCHEMA, ConfigError, defaults, load_config, load_config_file
from etiquette_proxy.units import parse_duration, parse_rate, parse_size

DEFAULT_FILE = Path(__file__).resolve().parents[2] / "config" / "etiquette.yaml"


def test_default_file_is_exactly_the_built_in_defaults():
    assert load_config_file(str(DEFAULT_FILE)).values == defaults().values


def test_every_key_is_documented_with_a_comment():
    text = DEFAULT_FILE.read_text().splitlines()
    for key in SCHEMA:
        leaf = key.split(".")[-1]
        idx = next((i for i, line in enumerate(text) if line.strip().startswith(f"{leaf}:")), None)
        assert idx is not None, f"{key} missing from config/etiquette.yaml"
        above = text[idx - 1].strip()
        assert above.startswith("#") or text[idx - 2].strip().startswith("#"), f"{key} has no comment"


@pytest.mark.parametrize("text,seconds", [
    ("250ms", 0.25), ("2s", 2), ("5m", 300), ("24h", 86400), ("7d", 604800), (3, 3), (1.5, 1.5), ("10", 10),
])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text,size", [("512KiB", 524288), ("10MiB", 10485760), ("1GiB", 2**30), (1024, 1024), ("1KB", 1000)])
def test_sizes(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text,rate", [(2, 2.0), ("2/s", 2.0), ("1/min", 1 / 60), ("30/h", 30 / 3600), (0.05, 0.05)])
def test_rates(text, rate):
    assert parse_rate(text) == pytest.approx(rate)


@pytest.mark.parametrize("bad", ["soon", "-1s", "1 fortnight", True, None, [1]])
def test_bad_durations(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_per_site_overrides_by_host_port_then_host():
    c = load_config('pacing:\n  rate: 2\nsites:\n  "a.test":\n    pacing: {rate: 0.5}\n  "a.test:8080":\n    pacing.rate: 9\n')
    assert c.for_site("a.test:443").pacing.rate == 0.5
    assert c.for_site("a.test:8080").pacing.rate == 9
    assert c.for_site("b.test:80").pacing.rate == 2
    assert c.for_site("a.test:443").pacing.burst == 1


def test_set_overrides_win_and_reach_sites():
    c = load_config("pacing:\n  rate: 2\n", "f.yaml", ["pacing.rate=3", 'sites."x.test:81".pacing.burst=4'])
    assert c.pacing.rate == 3
    assert c.for_site("x.test:81").pacing.burst == 4


ERRORS = [
    # (yaml, expected line in the message)
    ("pacing:\n  rate: -1\n", "f.yaml:2: pacing.rate: -1 must be > 0 (expected a rate in requests/s)"),
    ("pacing:\n  rate: fast\n", "f.yaml:2: pacing.rate: 'fast' is not a rate (expected"),
    ("pacing:\n  burts: 2\n", "f.yaml:2: pacing.burts: unknown key (expected one of the documented keys; did you mean pacing.burst?)"),
    ("pacing:\n  burst: 0\n", "f.yaml:2: pacing.burst: 0 must be >= 1 (expected an integer >= 1)"),
    ("pacing:\n  burst: 1.5\n", "f.yaml:2: pacing.burst: 1.5 is not a whole number"),
    ("robots:\n  ttl: 48h\n", "f.yaml:2: robots.ttl: '48h' is above the maximum (expected at most 24h)"),
    ("mode: loud\n", "f.yaml:1: mode: 'loud' is not allowed (expected one of: enforce, observe)"),
    ("pacing:\n  group_by: ip\n",
     "f.yaml:2: pacing.group_by: 'ip' is not allowed (expected one of: host, domain, address)"),
    ("pacing:\n  when_waiting: queue\n",
     "f.yaml:2: pacing.when_waiting: 'queue' is not allowed (expected one of: hold, answer)"),
    ("pacing:\n  address_ttl: 0s\n", "f.yaml:2: pacing.address_ttl: '0s' must be > 0 (expected a duration such as 2s)"),
    ('sites:\n  ex.test:\n    pacing: {group_by: domain}\n', 'f.yaml:3: sites."ex.test".pacing.group_by: '),
    ("upstream:\n  insecure: yes please\n", "f.yaml:2: upstream.insecure: 'yes please' is not a boolean (expected true or false)"),
    # SPEC §12 guards and timeouts; keys whose feature is not built (issue 11)
    ("listen:\n  proxyauth: any\n",
     "f.yaml:2: listen.proxyauth: 'any' accepts every password: an open proxy (expected user:password"),
    ("listen:\n  proxyauth: 'u:'\n", "f.yaml:2: listen.proxyauth: u:<0 characters> has too short a password"),
    ("listen:\n  proxyauth: 'u:short'\n", "u:<5 characters> has too short a password (expected user:password "
                                        "with a password of at least 12 characters)"),
    ("listen:\n  proxyauth: nocolon-but-long\n", "has no user name before ':'"),
    ("listen:\n  proxyauth: ':twelve-chars-pw'\n", "has no user name before ':'"),
    ("state:\n  backend: redis\n",
     "f.yaml:2: state.backend: 'redis' needs state.url set exactly when state.backend is redis"),
    ("state:\n  url: redis://127.0.0.1:6379/0\n",
     "f.yaml:2: state.url: 'diskcache' needs state.url set exactly when state.backend is redis"),
    ("state:\n  backend: redis\n  url: http://127.0.0.1:6379/\n",
     "f.yaml:3: state.url: 'http://127.0.0.1:6379/' is not a Redis URL (expected redis://host:port/db"),
    ("state:\n  backend: memcached\n", "f.yaml:2: state.backend: 'memcached' is not allowed (expected one of: "
     "diskcache, redis)"),
    ("listen:\n  header_timeout: 0\n", "f.yaml:2: listen.header_timeout: 0 must be > 0"),
    ("listen:\n  max_header_bytes: 512\n", "f.yaml:2: listen.max_header_bytes: 512 is under 1024 bytes "
                                           "(expected a size such as 64KiB"),
    ("listen:\n  max_header_bytes: lots\n", "f.yaml:2: listen.max_header_bytes: 'lots' is not a size"),
    ("upstream:\n  read_timeout: soon\n", "f.yaml:2: upstream.read_timeout: 'soon' is not a duration"),
    ("upstream:\n  max_connections: 0\n", "f.yaml:2: upstream.max_connections: 0 must be >= 1"),
    ("store:\n  max_body: huge\n", "f.yaml:2: store.max_body: 'huge' is not a size"),
    ("revisit:\n  volatile_patterns: ['(']\n", "f.yaml:2: revisit.volatile_patterns: '(' is not a valid regular expression"),
    ("revisit:\n  sitemaps: on\n", "f.yaml:2: revisit.sitemaps: True is not allowed (expected one of: off, read, "
     "fetch)"),
    ("revisit:\n  sitemaps: write\n", "f.yaml:2: revisit.sitemaps: 'write' is not allowed"),
    ("revisit:\n  sitemap_interval: 0\n", "f.yaml:2: revisit.sitemap_interval: 0 must be > 0"),
    ("pacing: 3\n", "f.yaml:1: pacing: 3 is not a section (expected a mapping of keys)"),
    ("robots:\n  retry_min: 2h\n", "robots.retry_min: 7200.0 must be <= robots.retry_max"),
    ("sites:\n  ex.test:\n    listen: {port: 1}\n", 'f.yaml:3: sites."ex.test".listen: unknown key'),
    ("sites:\n  ex.test:\n    pacing: {rate: 0}\n", 'f.yaml:3: sites."ex.test".pacing.rate: 0 must be > 0'),
    ("sites:\n  'not a site!':\n    pacing: {rate: 1}\n", 'f.yaml:2: sites."not a site!": is not a site'),
    ("pacing:\n  rate: 1\n  rate: 2\n", "f.yaml:3: rate: duplicate key"),
    ("pacing: [\n", "f.yaml:2: (yaml): not valid YAML"),
    ("- a\n- b\n", "f.yaml:1: (top): the config must be a mapping"),
    ("refusals:\n  strip: [Server, Retry-After]\n", "f.yaml:2: refusals.strip: 'Retry-After' is a header SPEC §7 never drops"),
    ("health:\n  canaries: [{url: x}]\n", "f.yaml:2: health.canaries: {'url': 'x'} is not a canary"),
]


@pytest.mark.parametrize("text,message", ERRORS)
def test_error_messages_name_file_line_key_and_rule(text, message):
    with pytest.raises(ConfigError) as e:
        load_config(text, "f.yaml")
    assert message in str(e.value)


def test_all_problems_reported_at_once_in_line_order():
    with pytest.raises(ConfigError) as e:
        load_config("pacing:\n  rate: -1\n  burst: 0\nmode: loud\nbogus: 1\n", "f.yaml")
    lines = str(e.value).splitlines()
    assert [line.split(":")[1] for line in lines] == ["2", "3", "4", "5"]


def test_bad_set_overrides_are_reported():
    with pytest.raises(ConfigError) as e:
        load_config("", "f.yaml", ["pacing.rate=abc", "nope=1", "novalue", 'sites."a".listen.port=1'])
    text = str(e.value)
    assert "--set:1: pacing.rate: 'abc' is not a rate" in text
    assert "--set:2: nope: unknown key" in text
    assert "--set:3: novalue: is not KEY=VALUE" in text
    assert '--set:4: sites."a".listen.port: unknown key' in text


def test_unreadable_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot be read"):
        load_config_file(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bin.yaml"
    bad.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="cannot be read"):
        load_config_file(str(bad))


def test_attribute_reads_equal_get_for_every_key_and_stay_per_config_object():
    # Attribute reads are kept on the Config object after the first (issue 17): they must be
    # what get() says for every key, and a new object (a reload) must answer its own values.
    from etiquette_proxy.config import SCHEMA, Config, defaults

    for config in (defaults(), defaults()):
        for key in SCHEMA:
            node = config
            for part in key.split("."):
                node = getattr(node, part)
            assert node == config.get(key), key
            assert getattr(config, key.split(".")[0]) is getattr(config, key.split(".")[0])  # kept
    first = defaults()
    assert first.upstream.read_timeout == SCHEMA["upstream.read_timeout"].default
    second = Config({**first.values, "upstream.read_timeout": 7.0})
    assert second.upstream.read_timeout == 7.0 and first.upstream.read_timeout != 7.0
    with pytest.raises(AttributeError):
        _ = first.upstream.no_such_key
    with pytest.raises(AttributeError):
        _ = first.no_such_section


@pytest.mark.parametrize("text,problem", [
    ("payments:\n  max_price: 0.05\n  daily_budget: \"USD 5\"\n",
     "<config>:2: payments.max_price: 0.05 is a bare number (expected \"USD 0.05\""),
    ("payments:\n  max_price: \"USD 0.05\"\n  daily_budget: \"5 dollars\"\n",
     "<config>:3: payments.daily_budget: '5 dollars' is not an amount"),
    ("payments:\n  max_price: \"USD 0\"\n  daily_budget: \"USD 5\"\n",
     "<config>:2: payments.max_price: 'USD 0' must be above zero"),
    ("payments:\n  max_price: \"USD 0.05\"\n", "<config>:2: payments.max_price: 'USD 0.05' needs payments.daily_budget"),
    ("payments:\n  max_price: \"EUR 0.05\"\n  daily_budget: \"USD 5\"\n",
     "<config>:2: payments.max_price: 'EUR 0.05' needs payments.daily_budget beside it, in the same currency"),
    ("payments:\n  max_price: \"USD 6\"\n  daily_budget: \"USD 5\"\n", "not below it"),
    ("sites:\n  shop.example:\n    payments: {max_price: 0.1}\n",
     "<config>:3: sites.\"shop.example\".payments.max_price: 0.1 is a bare number"),
])
def test_payment_settings_are_exact_money_checked_with_their_line(text, problem):
    with pytest.raises(ConfigError) as e:
        load_config(text)
    assert problem in str(e.value)


def test_payment_settings_read_exactly_and_per_site():
    from decimal import Decimal

    from etiquette_proxy.payments.money import CRAWL, PaymentLimits

    config = load_config('payments: {max_price: "USD 0.02", daily_budget: "USD 0.10"}\n'
                         'sites:\n  shop.example: {payments: {daily_budget: "USD 1.00"}}\n'
                         '  cheap.example: {payments: {max_price: "USD 0.01"}}\n')
    crawl = PaymentLimits.from_config(config, "news.example:443")
    assert crawl is not None and crawl.max_price.amount == Decimal("0.02") and crawl.bucket == CRAWL
    own = PaymentLimits.from_config(config, "shop.example:443")
    assert own is not None and own.bucket == "shop.example:443" and str(own.daily_budget) == "USD 1.00"
    cheap = PaymentLimits.from_config(config, "cheap.example:80")
    assert cheap is not None and str(cheap.max_price) == "USD 0.01" and cheap.bucket == CRAWL
    assert PaymentLimits.from_config(load_config(""), "news.example:443") is None


@pytest.mark.parametrize("text,mode", [("revisit:\n  sitemaps: off\n", "off"), ("revisit:\n  sitemaps: 'off'\n", "off"),
                                       ("revisit:\n  sitemaps: fetch\n", "fetch"), ("{}\n", "read")],
                         ids=["yaml-off-is-false", "quoted-off", "fetch", "default-read"])
def test_sitemaps_mode(text, mode):
    """SPEC §6: sitemaps are read as they pass by default; YAML's bare `off` reads as false."""
    assert load_config(text, "f.yaml").get("revisit.sitemaps") == mode
