"""The physical layer: GPUs, the cluster graph, the fair-share network and collectives on it."""
