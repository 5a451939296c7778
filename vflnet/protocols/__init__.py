"""What each role computes in one step of a protocol, independent of transport."""
