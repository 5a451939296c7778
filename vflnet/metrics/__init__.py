"""Metrics shared by attacks and experiments."""
