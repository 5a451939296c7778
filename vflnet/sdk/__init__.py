"""The plug-in SDK: the one module a protocol imports (see docs/architecture.md, "Writing a protocol").

``contract`` (a protocol's registered class, its sides and what it declares), ``context`` (what a side
may use of its host), ``handlers`` (``@handles``: a side's service methods, checked, metered and
answered with a status by the host), ``bridge`` (servers and channels, gRPC or in-process), ``checks``
``deadlines`` (what the hosts check on every message, and how long a step may take).
"""
