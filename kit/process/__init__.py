"""Process policy, above the engine: which GPU and cores this process has (placement), how much
device memory it may keep between runs (budget), and what it keeps and when it lets go (memory).
The engine builds batches and pools; this layer decides their lifetimes and hands the engine a
store to build them in (kit.engine.fixture.Store)."""
