"""`vflnet reproduce NAME`: longer experiments whose results are written down in docs/attacks.md."""
