"""Models: the target (aux-feature capture), the EAGLE-3 draft head, engine export formats."""
