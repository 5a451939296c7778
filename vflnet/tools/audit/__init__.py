"""`vflnet audit CONFIG`: every registered attack whose contract applies to a user's run, run and scored
against its baseline, with the reason each other attack does not apply (docs/audit.md).

- ``selection``: which attack sits where, derived from the contracts (roles, taps and rewrites against
  the protocol's methods, knowledge against what the run provides or the threat model may grant,
  ``transport.tls`` for a man in the middle, the attack's and the config's own checks);
- ``execute``: the runs (one run with every applicable tap per seed and defense setting, one run per
  rewriting attack), resumable, and the scores against baselines with an interval over the seeds;
- ``document``: the report (Markdown, self-contained HTML, JSON);
- ``cli``: the command.
"""
