"""What this machine can run, asked before any model loads: `cpu_features.py` (the CPU's
instruction sets and which fast paths need which) and `devices.py` (`--device` checked against this
torch build and machine). `eagle3 doctor` (`doctor.py`) reports both."""
