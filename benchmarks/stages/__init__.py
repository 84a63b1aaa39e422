"""One program per stage measurement (speed, bytes, cost), each printing JSON; the benches run them."""
