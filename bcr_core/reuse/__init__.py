"""Reuse: agent prompts and their two tokenization paths, KVComm's anchors and gate, and the
servers that answer one call (Dense, token-matched Dense, KVComm)."""
