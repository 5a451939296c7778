"""The threat model at run time, below hosts and protocols: typed knowledge and its providers, the views a
party hands its attacks, how attacks are built and attached to a party's wire, and model release.

Concrete attacks (vflnet/attacks/) build on this package; roles, protocols and validation use it and
never import an attack."""
