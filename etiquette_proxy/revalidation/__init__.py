"""Revalidation (SPEC §6): validators, the validator store, body fingerprints, revisit intervals, gone memory."""
