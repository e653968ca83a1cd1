"""One training step: the rank grid, pipeline schedules, and the engine that walks them."""
