"""The engines' plumbing, shared by the stages that talk to or hand files to an inference engine:
`engine_api.py` (every HTTP request to SGLang, vLLM, llama-server or the stand-in server: gen-data's
openai backend, `eval --endpoint`, serve-bench, serve's health wait), `local_engine.py` (an engine
started for one stage's run and stopped however it ends: `gen-data --engine vllm`, the llama.cpp
benchmarks), and llama.cpp's GGUF files both ways: `gguf.py` (a GGUF checkpoint in, as a
transformers folder) and `gguf_export.py` (a head and its target out, through llama.cpp's own
converter: `export --format gguf` writes them, `serve --engine llama.cpp` reads and checks them)."""
