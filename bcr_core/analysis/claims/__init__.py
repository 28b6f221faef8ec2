"""The paper's claims as families of tests read from records: how every verdict is read (`protocol`), the
synthetic grid's family (`synthetic`) and HumanEval's (`humaneval`), the tokenization tax (`tax`) and its
2x2 (`factorial`), Equation 3's line (`line`), a claim across models (`transfer`) and workloads
(`workload`), a confirmation read as its own family (`confirmation`) and sized from a pilot
(`planning`). It imports `statistics`, never `reports`."""
