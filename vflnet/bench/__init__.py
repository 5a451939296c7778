"""`vflnet bench NAME`: benchmarks; `vflnet bench` (or `all`) runs every one (vflnet.bench.suite)."""

# name -> module whose main(argv) runs it; each takes --smoke and --json (vflnet.bench.common)
BENCHMARKS = {
    "transport": "vflnet.bench.transport",
    "grpc-floor": "vflnet.bench.grpc_floor",
    "paillier": "vflnet.bench.paillier",
    "he-step": "vflnet.bench.he_step",
    "feature-reconstruction": "vflnet.bench.feature_reconstruction",
    "secureboost": "vflnet.bench.secureboost",
    "scaling": "vflnet.bench.scaling",
}
