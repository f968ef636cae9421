"""Hardware decisions over the core: compare GPU profiles and counts, recommend one for a deadline."""
