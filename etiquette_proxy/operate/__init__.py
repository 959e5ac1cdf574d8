"""Operator controls (SPEC §3 `sites`, `wrap`, `env`; SPEC §12 endpoint guard)."""
