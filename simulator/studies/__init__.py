"""Many simulations: sweeps, what-ifs, validation against published runs, benchmarks."""
