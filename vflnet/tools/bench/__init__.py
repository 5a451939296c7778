"""`vflnet bench NAME`: benchmarks; `vflnet bench` (or `all`) runs every one (vflnet.tools.bench.suite)."""

from vflnet.subcommands import Command

# name -> the module whose main(argv) runs it and what it measures; each takes --smoke and --json
# (vflnet.tools.bench.common)
BENCHMARKS: dict[str, Command] = {
    "transport": Command(
        "vflnet.tools.bench.transport",
        "steps/s, ms per step and bytes of a training step: gRPC processes vs loopback vs in-process reference",
    ),
    "grpc-floor": Command(
        "vflnet.tools.bench.grpc_floor",
        "the same digits step in bare Python gRPC processes: the floor under `transport`",
    ),
    "paillier": Command(
        "vflnet.tools.bench.paillier",
        "Paillier encryptions, decryptions and mat-vec multiply-adds per second: vflnet's engine vs phe",
    ),
    "he-step": Command(
        "vflnet.tools.bench.he_step",
        "seconds and bytes per split-he training step vs python-paillier",
    ),
    "feature-reconstruction": Command(
        "vflnet.tools.bench.feature_reconstruction",
        "seconds of paper 000's feature reconstruction (Algorithm 1) against d_A, per method",
    ),
    "secureboost": Command(
        "vflnet.tools.bench.secureboost",
        "seconds and bytes per SecureBoost tree: engine vs phe objects vs plaintext",
    ),
    "secureboost-anchors": Command(
        "vflnet.tools.bench.secureboost_anchors",
        "seconds per SecureBoost tree at FATE 2.0's and SecretFlow SGB's settings, beside xgboost and their "
        "figures, per core",
    ),
    "cafe": Command(
        "vflnet.tools.bench.cafe",
        "ms per CAFE iteration at the paper's setting: the attack alone and a training step with it, CPU and GPU",
    ),
    "startup": Command(
        "vflnet.tools.bench.startup",
        "seconds to start a role process, a run and a sweep's runs: cold (new interpreters) vs warm (fork server)",
    ),
    "netem": Command(
        "vflnet.tools.bench.netem",
        "split step time in the network lab under one-way delays against 2 x delay and the plain-TCP round trip (root)",
    ),
    "scaling": Command(
        "vflnet.tools.bench.scaling",
        "step time, CPU per step and memory (PSS) of every role against the number of passive parties (1..256)",
    ),
    "psi": Command(
        "vflnet.tools.bench.psi",
        "seconds, CPU seconds, peak RSS and bytes per ID of private set intersection (alignment.method psi) "
        "over gRPC processes, 2 and 3 parties, beside openmined-psi",
    ),
    "goals": Command(
        "vflnet.tools.bench.goals",
        "start-up, sweep overhead, netem steps, vflnet vs its floor and the trace tap against their goals, "
        "in one run",
    ),
}
