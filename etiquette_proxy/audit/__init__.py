"""The audit log (SPEC §10): one line per decision, hash-chained."""
