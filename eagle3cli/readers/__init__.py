"""Reading what eagle3 does not control, one way everywhere: `sources.py` (named data sources:
gen-data inputs, eval benches, serve-bench prompts), `jsonl.py` (JSON lines split at "\\n" only) and
`limits.py` (bounds on input files and engine replies: size, decompressed size, JSON depth)."""
