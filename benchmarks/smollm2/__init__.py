"""The SmolLM2-135M-Instruct bench behind `make bench-smollm2` and docs/results-smollm2.md."""
