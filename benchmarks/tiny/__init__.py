"""The tiny-target bench behind `make bench` and docs/results.md."""
