"""The report layer: run records, results files and known failures. Torch-free and engine-free: the matrix reads it."""
