"""eagle3: regenerate data, cache hidden states, train, evaluate and serve EAGLE-3 draft heads."""

__version__ = "0.1.0"
