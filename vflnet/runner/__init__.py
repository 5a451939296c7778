"""Local cluster launcher, in-process reference trainer, reports."""
