"""`eagle3 cache`: chat-template tokenisation with assistant loss masks, the draft vocabulary,
and the target's multi-layer hidden states in sharded, checksummed safetensors."""
