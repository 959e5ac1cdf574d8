"""robots.txt (RFC 9309, SPEC §4): parsing, matching, verdicts, declared purposes."""
