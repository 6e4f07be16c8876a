"""What every layer shares and that imports nothing of omniweb above it: errors and their kinds,
the process budget, metrics, task spawning, the JSON wire rules, device selection."""
