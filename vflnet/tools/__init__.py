"""The tools wing: commands that drive runs (reproductions, benchmarks, sweeps and reports, the network lab,
the privacy audit); nothing below imports from here."""
