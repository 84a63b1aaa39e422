"""`eagle3 serve`: preflight checks, engine commands (SGLang / vLLM), launch + health, load bench."""
