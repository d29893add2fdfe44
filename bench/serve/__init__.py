"""A model-shaped serving loop over Tessera, FlashInfer, SDPA and FlexAttention (a benchmark, not a product
API). Entry point: bench/serve/run_all.py; design: docs/performance.md, "Serving loop"."""
