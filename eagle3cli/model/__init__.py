"""The shell's model plumbing, which writes no files: opening a target (`target.py`), reading heads
of any layout (`heads.py`, `headcheck.py`), chat templates, a generation KV cache, CPU kernels
and the engines' support tables. The method itself is `speculate/`."""
