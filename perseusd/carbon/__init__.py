"""Carbon- and price-aware training: grid signals, their forecast, and the frontier point to run (Chase)."""
