"""robots.txt state per origin: the memory each origin's entry and compiled rules hold once every
origin's rules are compiled and its entry rests beside them (as at 100,000 origins in
`scale.py sites`), for robots.txt files of several shapes: scale.py's own (7 lines), a shop
(~2 KB), a news site (~10 KB), a large wiki (~22 KB), a pathological 500 KiB file of 15,381
rules (at most 50 origins: each compiles in about a second), and the news file asked by five
crawlers (one declaring a purpose), every origin's file its own (a site-specific rule and
sitemap). Each shape runs in its own process, the scale.py way (a state store in a temp dir, the
entry registry bounded at 200,000, each robots.txt fetched, kept, saved and asked three times
per crawler).

Per shape: RSS grown per origin and in all (origins named as the proxy names them), how many origins
stay compiled and what the rules cache counts for each (`estimated`: RulesCache._size), so how
many of them its budget (PARSED_BUDGET) holds; with --traced, the bytes tracemalloc sees freed
when the cache lets go of every compiled origin (`held`: what they really hold, the tables that
share patterns apart), and estimated / held. `--before DIR` runs the same against another
checkout (`git worktree add --detach /tmp/before BASE`) for a before/after pair.

    python benchmarks/robots_memory.py [--origins 2000] [--shapes tiny,shop,news,large,huge,crawlers] [--traced] [--before DIR]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

OTHER_CHECKOUT = "ETIQUETTE_ROBOTS_MEMORY_OTHER"  # set in the before arm's environment
sys.path.insert(0, str(Path(__file__).resolve().parent))
if not os.environ.get(OTHER_CHECKOUT):  # else PYTHONPATH names the other checkout's packages
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _harness import checkout_path, rss_mb, same_checkout  # noqa: E402

TOKEN = "benchbot"  # the crawler's product token: no group of its own, `*` applies
# scale.py's robots.txt (its ROBOTS): one rule of each origin's own
TINY = ("User-agent: *\nDisallow: /private/\nDisallow: /cgi-bin/\nAllow: /private/open/\n"
        "Disallow: /only-{i}/\n\nUser-agent: badbot\nDisallow: /\n")
PATHS = ["/page/0", "/page/1", "/page/2"]

# Bots a news site turns away by name, each its own group.
AI_BOTS = ["GPTBot", "ChatGPT-User", "OAI-SearchBot", "CCBot", "anthropic-ai", "ClaudeBot", "Claude-Web",
           "Google-Extended", "PerplexityBot", "Bytespider", "Amazonbot", "Applebot-Extended", "cohere-ai",
           "Diffbot", "FacebookBot", "Meta-ExternalAgent", "ImagesiftBot", "Omgilibot", "Omgili",
           "PetalBot", "YouBot", "Timpibot", "Webzio-Extended", "AI2Bot", "Ai2Bot-Dolma", "DuckAssistBot",
           "iaskspider/2.0", "ICC-Crawler", "Kangaroo Bot", "magpie-crawler", "MistralAI-User", "Scrapy",
           "SemrushBot", "AhrefsBot", "MJ12bot", "DotBot", "BLEXBot", "DataForSeoBot", "serpstatbot",
           "SeekportBot"]
SECTIONS = ["news", "politics", "business", "tech", "science", "sport", "culture", "opinion", "travel",
            "health", "world", "local", "weather", "video", "podcasts", "live", "puzzles", "food"]
LANGS = ["Spezial", "Sp%C3%A9cial", "Especial", "Speciale", "%D0%A1%D0%BB%D1%83%D0%B6%D0%B5%D0%B1%D0%BD%D0%B0%D1%8F",
         "%E7%89%B9%E5%88%A5", "Speciaal", "Specjalna", "Especial", "%D8%AE%D8%A7%D8%B5"]
SPECIAL_PAGES = ["Search", "Random", "RecentChanges", "Export", "Watchlist", "UserLogin", "Preferences",
                 "Contributions", "WhatLinksHere", "RecentChangesLinked", "Log", "Book", "CreateAccount",
                 "Userlogout", "ComparePages", "Diff", "History", "Undelete", "MovePage", "Block"]


def shop() -> str:
    """A WordPress shop's robots.txt (~2 KB): the cart, checkout and faceted search kept out."""
    lines = ["# robots.txt for {i}", "User-agent: *", "Disallow: /wp-admin/", "Allow: /wp-admin/admin-ajax.php",
             "Disallow: /wp-login.php", "Disallow: /cart/", "Disallow: /checkout/", "Disallow: /my-account/",
             "Disallow: /*?add-to-cart=*", "Disallow: /*?orderby=*", "Disallow: /*?filter_*", "Disallow: /*?s=*",
             "Disallow: /*.php$", "Disallow: /trackback/", "Disallow: /feed/", "Disallow: /*/feed/$",
             "Disallow: /tag/*/page/", "Disallow: /search/", "Disallow: /wp-content/plugins/",
             "Allow: /wp-content/uploads/", "Disallow: /xmlrpc.php", "Disallow: /*?replytocom",
             "Disallow: /shop-{i}/preview/"]
    lines += [f"Disallow: /product-category/*?{facet}=*" for facet in
              ("pa_color", "pa_size", "pa_brand", "min_price", "max_price", "rating_filter", "stock")]
    lines += [f"Disallow: /collections/*{facet}*" for facet in ("+", "%2B", "sort_by", "filter.v.")]
    lines += ["", "User-agent: bingbot", "Crawl-delay: 5", ""]
    for bot in ("AhrefsBot", "SemrushBot", "MJ12bot", "DotBot", "BLEXBot", "PetalBot"):
        lines += [f"User-agent: {bot}", "Disallow: /", ""]
    lines += [f"Sitemap: https://www.shop{{i}}.example/{name}.xml" for name in
              ("sitemap_index", "product-sitemap", "page-sitemap", "post-sitemap", "product_cat-sitemap")]
    body = "\n".join(lines) + "\n"
    return body + "# " + "-" * 70 + "\n" + "".join(f"# {s} pages are crawlable\n" for s in SECTIONS)


def news() -> str:
    """A news site's robots.txt (~10 KB): AI crawlers turned away by name, sections' search,
    tracking parameters and account pages kept out, a long list of sitemaps."""
    lines = ["# News robots.txt {i}: see https://www.news{i}.example/terms", ""]
    for bot in AI_BOTS:
        lines += [f"User-agent: {bot}", "Disallow: /", ""]
    lines += ["User-agent: Googlebot-News", "Allow: /", "Disallow: /account/", "", "User-agent: *"]
    for section in SECTIONS:
        lines += [f"Disallow: /{section}/search", f"Disallow: /{section}/*?page=*", f"Disallow: /{section}/print/",
                  f"Allow: /{section}/live/", f"Disallow: /{section}/*/comments$", f"Disallow: /{section}/*?ref=*",
                  f"Disallow: /{section}/tag/*/page/", f"Disallow: /{section}/author/*/feed"]
    lines += ["Disallow: /account/", "Disallow: /login", "Disallow: /subscribe/checkout", "Disallow: /api/",
              "Disallow: /*?utm_*", "Disallow: /*&utm_*", "Disallow: /*?cmp=*", "Disallow: /*?share=*",
              "Disallow: /search", "Disallow: /newsletters/manage", "Disallow: /amp/*?*", "Disallow: /embed/",
              "Disallow: /preview/", "Disallow: /edition-{i}/drafts/", "Allow: /api/oembed"]
    lines += [f"Disallow: /{year}/*/gallery/*?slide=*" for year in range(2005, 2026)]
    lines += ["Content-Signal: search=yes, ai-train=no", ""]
    lines += [f"Sitemap: https://www.news{{i}}.example/sitemaps/{section}-{year}.xml"
              for section in SECTIONS for year in (2023, 2024, 2025)]
    return "\n".join(lines) + "\n"


def large() -> str:
    """A large wiki's robots.txt (~22 KB): a long list of bad bots, special pages in every
    language, percent-encoded, and comments explaining them."""
    lines = ["#", "# robots.txt for https://www.wiki{i}.example/ and friends", "#",
             "# Please note: there are a lot of pages on this site, and there are some misbehaved",
             "# spiders out there that go way too fast. If you're irresponsible, your access to the",
             "# site may be blocked.", "#", ""]
    names = ("Zealbot", "MSIECrawler", "SiteSnagger", "WebStripper", "WebCopier", "Fetch", "Offline Explorer",
             "Teleport", "TeleportPro", "WebZIP", "linko", "HTTrack", "Microsoft.URL.Control", "Xenu", "larbin",
             "libwww", "ZyBORG", "Download Ninja")
    bad = [f"{name}{n}" for n in range(2) for name in names]
    for bot in bad:
        lines += [f"# {bot} is a download manager that ignores the rate", f"User-agent: {bot}", "Disallow: /", ""]
    lines += ["User-agent: *", "Allow: /w/api.php?action=mobileview&", "Allow: /w/load.php?",
              "Allow: /api/rest_v1/?doc", "Disallow: /w/", "Disallow: /api/", "Disallow: /trap/",
              "Disallow: /wiki/Special:", "Disallow: /wiki/Spezial:", "Disallow: /wiki/Spesial:",
              "Disallow: /wiki-{i}/drafts/"]
    for lang in LANGS:
        for page in SPECIAL_PAGES:
            lines.append(f"Disallow: /wiki/{lang}:{page}")
            lines.append(f"Disallow: /wiki/{lang}%3A{page}")
    lines += [f"Disallow: /wiki/Wikipedia:Articles_for_deletion/{n}" for n in range(20)]
    return "\n".join(lines) + "\n"


def huge() -> str:
    """A pathological robots.txt: 500 KiB (RFC 9309 §2.5's least a crawler must parse) of rules
    of the site's own, a third of them wildcards."""
    lines = ["User-agent: *"]
    size, n = 14, 0
    while size < 500 * 1024 - 200:
        line = f"Disallow: /site-{{i}}/section-{n}/*.php$" if n % 3 == 0 else f"Disallow: /site-{{i}}/item-{n}/"
        lines.append(line)
        size += len(line) + 1
        n += 1
    return "\n".join(lines) + "\n"


SHAPES = {"tiny": None, "shop": shop, "news": news, "large": large, "huge": huge, "crawlers": news}
HUGE_ORIGINS = 50
# The crawlers asking each origin, and the purposes they declare (the news file names GPTBot and
# CCBot: groups of their own; Googlebot-News too; the others take `*`).
CRAWLERS = {"crawlers": [("benchbot", ()), ("gptbot", ()), ("googlebot-news", ()), ("ccbot", ()),
                         ("aibot", ("ai-train",))]}


def request_path_us(policy: Any, entries: Any, config: Any, settings: Any, crawler: tuple[str, tuple[str, ...]],
                    origins: list[str], evicted: bool) -> float:
    """Median µs of the gate's per-request core calls (robots_gate._gate: find, is_fresh,
    verdict_for_target, crawl_delay) for `origins`, each resting beside its compiled rules, or
    (`evicted`) dropped from the rules cache first, as its eviction drops it: read back from
    the state store and compiled again on the request."""
    token, purposes = crawler
    times = []
    for origin in origins:
        if evicted:
            cache = getattr(policy, "rules", policy)  # (the rules cache: its own object since robots/cache.py)
            cache._drop(cache._parsed[origin])  # noqa: SLF001 - outside the time taken
        t0 = time.perf_counter()
        entry = entries.find(config, origin)
        policy.is_fresh(entry)
        policy.verdict_for_target(entry, "/page/1", token, purposes)
        policy.crawl_delay(entry, token, settings)
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times) * 1e6, 1)


def child(shape: str, n: int, traced: bool, timed: bool) -> dict[str, object]:
    """One shape, in its own process."""
    same_checkout(OTHER_CHECKOUT)
    import importlib.util

    import etiquette_proxy.robots.policy as robots
    from etiquette_proxy.config import load_config
    from etiquette_proxy.robots.policy import FetchResult, RobotsPolicy, RobotsSettings, entry_registry
    from etiquette_proxy.state.local import DiskState

    make = SHAPES[shape]
    if make is huge:
        n = min(n, HUGE_ORIGINS)
    crawlers = CRAWLERS.get(shape, [(TOKEN, ())])
    template = (TINY if make is None else make()).replace("{i}", "{0}")
    tmp = tempfile.TemporaryDirectory(prefix="etiquette-robots-memory-")
    state = DiskState(f"{tmp.name}/state")
    config = load_config("", overrides=["state.max_sites_in_memory=200000"])
    policy, settings = RobotsPolicy(), RobotsSettings()
    entries = entry_registry(lambda: state, policy)
    gc.collect()  # (a full collection empties the free lists: every block from here on is traced)
    base = rss_mb()
    if traced:
        tracemalloc.start()
    t0 = time.perf_counter()
    for start in range(0, n, 500):
        with state._cache.transact():  # noqa: SLF001 - setup speed only (each save still one put)
            for i in range(start, min(n, start + 500)):
                origin = f"http://site{i}.example:80"  # the entry's own, as a fetch's in the proxy
                body = template.format(i).encode()
                entries.put(config, origin, policy.after_fetch(origin, FetchResult(200, body), None, settings))
                entries.save(origin)
                for token, purposes in crawlers:
                    for path in PATHS:  # the first request compiles, as in the proxy
                        policy.verdict(entries.find(config, origin), path, token, purposes)  # type: ignore[arg-type]
    build_s = time.perf_counter() - t0
    gc.collect()
    grown = rss_mb() - base
    # The rules cache and the modules holding its budget and shared tables: robots/cache.py,
    # memory.py and entry.py, or (a checkout before the split) the policy and policy.py.
    cache = getattr(policy, "rules", policy)
    split = importlib.util.find_spec("etiquette_proxy.robots.cache") is not None
    modules = ([importlib.import_module(f"etiquette_proxy.robots.{m}") for m in ("cache", "memory", "entry")]
               if split else [robots])
    budget = modules[0].PARSED_BUDGET
    compiled = len(cache._parsed)  # noqa: SLF001
    estimated = cache._parsed_bytes / max(1, compiled)  # noqa: SLF001
    out: dict[str, object] = {
        "shape": shape, "origins": n, "text_bytes": len(template.format(n // 2).encode()),
        "rss_per_origin": round(grown * 2**20 / n), "rss_grown_mb": round(grown, 1),
        "compiled": compiled, "first_tier": len(entries),
        "estimated_per_origin": round(estimated), "budget_mb": budget // 2**20,
        "fit_in_budget": int(budget // max(1.0, estimated)), "build_s": round(build_s, 1),
    }
    if timed:
        # origins compiled and resting (the most recently used: whatever the budget kept), then others
        kept = [origin for origin in list(cache._parsed)[-400:] if origin not in entries]  # noqa: SLF001
        count = 5 if make is huge else 200
        out["path_compiled_us"] = request_path_us(policy, entries, config, settings, crawlers[0], kept[-count:], False)
        out["path_reparsed_us"] = request_path_us(policy, entries, config, settings, crawlers[0],
                                                  kept[-2 * count:-count] or kept[:1], True)
    if traced:
        out["traced_per_origin"] = round(tracemalloc.get_traced_memory()[0] / n)
        # What the compiled origins hold: the bytes freed when the cache lets go of them all.
        # The tables sharing patterns, groups and what entries say keep what they keep; what
        # they hold only lately (each first holder's own object) goes too.
        for module in modules:
            for name in ("_PATTERNS", "_GROUPS", "_SAYS", "PATTERNS", "GROUPS", "SAYS"):
                table = getattr(module, name, None)
                if table is not None:
                    table._recent.clear()  # noqa: SLF001
        own = getattr(cache, "says_alike", getattr(cache, "_says_alike", None))
        if own is not None:
            own._recent.clear()  # noqa: SLF001
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        cache._parsed.clear()  # noqa: SLF001
        cache._more.clear()  # noqa: SLF001
        setattr(cache, "recalled" if split else "_recalled", None)
        gc.collect()
        held = (before - tracemalloc.get_traced_memory()[0]) / max(1, compiled)
        out["held_per_origin"] = round(held)
        out["estimated_over_held"] = round(estimated / held, 2) if held else None
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--origins", type=int, default=2000)
    ap.add_argument("--shapes", default="tiny,shop,news,large,huge,crawlers")
    ap.add_argument("--traced", action="store_true", help="tracemalloc's bytes too (slower)")
    ap.add_argument("--path", action="store_true",
                    help="the request path's µs too: an origin compiled, and one read back and compiled again")
    ap.add_argument("--before", metavar="DIR", help="another checkout, measured first")
    a = ap.parse_args()
    shapes = a.shapes.split(",")
    for shape in shapes:
        if shape not in SHAPES:
            ap.error(f"--shapes: {shape!r} is not one of {', '.join(SHAPES)}")
    with tempfile.TemporaryDirectory(prefix="etiquette-robots-memory-") as scratch:
        arms: list[tuple[str, dict[str, str]]] = [("after", dict(os.environ))]
        if a.before:
            env = dict(os.environ, PYTHONPATH=checkout_path(Path(a.before), Path(scratch)))
            env[OTHER_CHECKOUT] = "1"
            arms.insert(0, ("before", env))
        for shape in shapes:
            for name, env in arms:
                cmd = [sys.executable, __file__, "_child", shape, str(a.origins)]
                cmd += (["traced"] if a.traced else []) + (["path"] if a.path else [])
                r = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout)
                print(f"{name:>6} {shape:>8}: {r['origins']} origins, text {r['text_bytes']:>6} B; RSS"
                      f" {r['rss_per_origin']:>6} B per origin, {r['rss_grown_mb']} MB in all; {r['compiled']} compiled,"
                      f" estimated {r['estimated_per_origin']} B each"
                      + (f", held {r['held_per_origin']} B (x{r['estimated_over_held']})" if a.traced else "")
                      + f"; {r['fit_in_budget']} fit in {r['budget_mb']} MB; built in {r['build_s']} s"
                      + (f"; request path {r['path_compiled_us']} µs compiled, {r['path_reparsed_us']} µs read"
                         " back and compiled" if a.path else ""))
                sys.stdout.flush()
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["_child"]:
        print(json.dumps(child(sys.argv[2], int(sys.argv[3]), "traced" in sys.argv[4:], "path" in sys.argv[4:])))
        sys.exit(0)
    sys.exit(main())
