"""Runaway guard (SPEC §7): retired paths, trap detection, bounded value sets."""
