"""The engine runtime: driven loops, the scheduler that steps them, and the client the transport uses."""
