"""`vflnet bench NAME`: benchmarks; `vflnet bench` (or `all`) runs every one (vflnet.tools.bench.suite)."""

# name -> (module whose main(argv) runs it, what it measures); each takes --smoke and --json
# (vflnet.tools.bench.common)
BENCHMARKS = {
    "transport": (
        "vflnet.tools.bench.transport",
        "steps/s, ms per step and bytes of a training step: gRPC processes vs loopback vs in-process reference",
    ),
    "grpc-floor": (
        "vflnet.tools.bench.grpc_floor",
        "the same digits step in bare Python gRPC processes: the floor under `transport`",
    ),
    "paillier": (
        "vflnet.tools.bench.paillier",
        "Paillier encryptions, decryptions and mat-vec multiply-adds per second: vflnet's engine vs phe",
    ),
    "he-step": (
        "vflnet.tools.bench.he_step",
        "seconds and bytes per split-he training step vs python-paillier",
    ),
    "feature-reconstruction": (
        "vflnet.tools.bench.feature_reconstruction",
        "seconds of paper 000's feature reconstruction (Algorithm 1) against d_A, per method",
    ),
    "secureboost": (
        "vflnet.tools.bench.secureboost",
        "seconds and bytes per SecureBoost tree: engine vs phe objects vs plaintext",
    ),
    "secureboost-anchors": (
        "vflnet.tools.bench.secureboost_anchors",
        "seconds per SecureBoost tree at FATE 2.0's and SecretFlow SGB's settings, beside xgboost and their figures, per core",
    ),
    "cafe": (
        "vflnet.tools.bench.cafe",
        "ms per CAFE iteration at the paper's setting: the attack alone and a training step with it, CPU and GPU",
    ),
    "startup": (
        "vflnet.tools.bench.startup",
        "seconds to start a role process, a run and a sweep's runs: cold (new interpreters) vs warm (fork server)",
    ),
    "netem": (
        "vflnet.tools.bench.netem",
        "split step time in the network lab under one-way delays against 2 x delay and the plain-TCP round trip (root)",
    ),
    "scaling": (
        "vflnet.tools.bench.scaling",
        "step time, CPU per step and memory (PSS) of every role against the number of passive parties (1..256)",
    ),
    "goals": (
        "vflnet.tools.bench.goals",
        "start-up, sweep overhead, netem steps, vflnet vs its floor and the trace tap against their goals, "
        "in one run",
    ),
}
