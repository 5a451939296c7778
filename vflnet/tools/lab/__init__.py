"""The network lab: the parties on separate hosts (network namespaces) of one machine."""
