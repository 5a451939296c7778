"""Datasets (no downloads), vertical partitioning, and sample alignment."""
