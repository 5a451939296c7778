"""The audit's two budgets (``vflnet audit`` and ``--quick``), apart from vflnet.tools.audit.execute so
that the command's help names them without importing torch."""

SEEDS = {"quick": 2, "default": 3}
# --quick caps training (every other setting stays the user's): one epoch, at most this many steps
QUICK_TRAIN = {"epochs": 1, "max_steps": 10}
