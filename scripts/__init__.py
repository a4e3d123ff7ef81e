"""absl binaries: train, adapt, privacy, benchmark, plot."""
