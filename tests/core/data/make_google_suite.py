"""Convert Google's robots.txt conformance suite into tests/core/data/google_robotstxt_suite.json.

The suite (github.com/google/robotstxt-spec-test, Apache-2.0) keeps its cases as textproto files
in src/main/resources/CTC/{correctness,stress}. This script reads them from a git directory
(a clone or a bare mirror) and writes the cases as JSON, naming the commit they came from, so
the tests need neither the suite's Java code nor protobuf:

    python tests/core/data/make_google_suite.py /path/to/robotstxt-spec-test/.git

robots.txt bodies are bytes (some start with a partial BOM): they are written as UTF-8 text with
undecodable bytes as lone surrogates (`surrogateescape`), which JSON keeps exactly.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = "google/robotstxt-spec-test"
ROOT = "src/main/resources/CTC"
OUT = Path(__file__).with_name("google_robotstxt_suite.json")

_TOKEN = re.compile(rb'\s+|#[^\n]*|"(?:[^"\\\n]|\\.)*"|[A-Za-z_][A-Za-z0-9_]*|[:\[\]{},]')
_ESCAPES = {b"n": b"\n", b"r": b"\r", b"t": b"\t", b'"': b'"', b"'": b"'", b"\\": b"\\"}


def _unquote(literal: bytes) -> bytes:
    """The bytes a textproto string literal stands for (C escapes: \\n, \\xHH, octal)."""
    out, i, body = bytearray(), 0, literal[1:-1]
    while i < len(body):
        c = body[i:i + 1]
        if c != b"\\":
            out += c
            i += 1
            continue
        e = body[i + 1:i + 2]
        if e == b"x":
            m = re.match(rb"[0-9A-Fa-f]{1,2}", body[i + 2:])
            assert m, literal
            out.append(int(m.group(0), 16))
            i += 2 + len(m.group(0))
        elif e.isdigit():
            m = re.match(rb"[0-7]{1,3}", body[i + 1:])
            assert m, literal
            out.append(int(m.group(0), 8))
            i += 1 + len(m.group(0))
        else:
            out += _ESCAPES[e]
            i += 2
    return bytes(out)


def parse_textproto(data: bytes) -> Any:
    """A small reader for the textproto subset the suite uses: messages, lists, strings, enums."""
    tokens = [t for t in _TOKEN.findall(data) if t.strip() and not t.startswith(b"#")]
    if b"".join(_TOKEN.findall(data)) != data:
        raise ValueError("unexpected characters in textproto")
    pos = 0

    def value() -> Any:
        nonlocal pos
        tok = tokens[pos]
        if tok == b"{":
            pos += 1
            fields: dict[str, list[Any]] = {}
            while tokens[pos] != b"}":
                name = tokens[pos].decode()
                pos += 1
                if tokens[pos] == b":":
                    pos += 1
                v = value()
                fields.setdefault(name, []).extend(v if isinstance(v, list) else [v])
                if tokens[pos] == b",":
                    pos += 1
            pos += 1
            return fields
        if tok == b"[":
            pos += 1
            items = []
            while tokens[pos] != b"]":
                items.append(value())
                if tokens[pos] == b",":
                    pos += 1
            pos += 1
            return items
        if tok.startswith(b'"'):
            parts = []
            while pos < len(tokens) and tokens[pos].startswith(b'"'):  # adjacent literals join
                parts.append(_unquote(tokens[pos]))
                pos += 1
            return b"".join(parts)
        pos += 1
        return tok.decode()  # enum name

    tokens = [b"{", *tokens, b"}"]
    return value()


def http_testable(url: str) -> str | None:
    """Why a case cannot be asked as an HTTP request through a proxy, or None when it can."""
    if not url:
        return "no URL: asks about the empty string"
    if any(ord(c) > 127 for c in url):
        return "raw non-ASCII request target: not a valid HTTP request line"
    return None


def main(git_dir: str) -> None:
    def git(*args: str) -> bytes:
        return subprocess.run(["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True).stdout

    commit = git("rev-parse", "HEAD").decode().strip()
    files = sorted(p for p in git("ls-tree", "-r", "--name-only", "HEAD", ROOT).decode().split()
                   if p.endswith(".textproto"))
    cases = []
    for path in files:
        spec = parse_textproto(git("show", f"HEAD:{path}"))
        for t, test in enumerate(spec["tests"]):
            body = b"".join(test.get("robotstxt", [b""]))
            for e, exp in enumerate(test["test_expectations"]):
                url = exp["testurl"][0].decode("utf-8")
                outcome = exp["expected_outcome"][0]
                assert outcome in ("ALLOWED", "DISALLOWED"), outcome
                case = {
                    "id": f"{path.removeprefix(ROOT + '/').removesuffix('.textproto')}#{t}.{e}",
                    "robotstxt": body.decode("utf-8", "surrogateescape"),
                    "url": url,
                    "useragent": exp["useragent"][0].decode("utf-8"),
                    "allowed": outcome == "ALLOWED",
                    "google_specific": exp.get("test_type", ["STANDARD"])[0] == "GOOGLE_SPECIFIC",
                }
                why = http_testable(url)
                if why:
                    case["not_http"] = why
                cases.append(case)
    doc = {
        "source": f"https://github.com/{REPO}",
        "commit": commit,
        "license": "Apache-2.0",
        "files": files,
        "generated_by": "tests/core/data/make_google_suite.py",
        "cases": cases,
    }
    OUT.write_text(json.dumps(doc, indent=1, ensure_ascii=True) + "\n")
    http = sum(1 for c in cases if "not_http" not in c)
    print(f"{len(cases)} cases ({http} HTTP-testable) from {REPO}@{commit} -> {OUT}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
