"""Reading a simulated step: metrics, critical path, link use, comm map, traces and plots."""
