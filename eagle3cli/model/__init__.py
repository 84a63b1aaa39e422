"""The shell's model plumbing, which writes no files: opening a target (`target.py`), configs checked
before a tensor is made (`config_check.py`), chat templates, a generation KV cache and CPU kernels.
Heads are `head/`; the method itself is `speculate/`."""
