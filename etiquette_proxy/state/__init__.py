"""Per-site state that survives restarts (SPEC §10): the interface and its implementations."""
