"""The run-folder contract every stage keeps: `manifest.py` (atomic writes, checksums, fingerprints,
the manifest written last and checked by the next stage), `folders.py` (which folder a stage may
write into) and `lock.py` (one writer per stage folder)."""
