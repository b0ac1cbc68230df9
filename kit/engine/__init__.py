"""The engine: a case, its plan and layout, the pools, the batch and fixture, and the float64 reference."""
