"""`eagle3 export`: a head of any layout written in another engine's layout (SGLang, vLLM,
speculators), read and checked first."""
