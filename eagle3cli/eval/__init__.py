"""`eagle3 eval`: speculative decoding on transformers (chain and EAGLE-2 tree) or against a
running SGLang server; acceptance by depth, tau, speedup, losslessness, report + plot."""
