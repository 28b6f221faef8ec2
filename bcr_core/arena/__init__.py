"""The selector arena: every selector on the same assembled cache at the same rows,
measured against Dense, with an oracle as the ceiling. `selectors` holds the rules, `registry`
turns names such as `cacheblend:layer=2` into them, `arena` runs them on every call of a
KVComm-family run, `measures` reads the records (per item, against the coin and the draft)."""
