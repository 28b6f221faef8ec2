"""Repair: Budgeted Cache Repair (paper §3) and its controls: row scores from the draft, selectors,
layouts, the BCR server and OpenGate."""
