"""Generated from proto/vflnet/v1 by vflnet.wire.codegen. Do not edit."""
