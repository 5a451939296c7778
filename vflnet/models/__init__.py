"""Model zoo (bottom and top models built from config) and optimizers."""
