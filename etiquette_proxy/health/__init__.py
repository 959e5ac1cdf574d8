"""Site health (SPEC §8): response signals, the score, bands, history, parser health."""
