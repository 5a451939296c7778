"""One module per role. Each role is one OS process with its own gRPC server."""
