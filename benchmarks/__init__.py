"""Measurements of the eagle3 stages: the tiny-target bench (`make bench`), the SmolLM2 bench
(`make bench-smollm2`) and one program per stage they run. Not part of the package."""
