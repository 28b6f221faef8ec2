"""Loading records and printing them: the per-condition table every command and notebook shows
(`summary`), the claims' grid of runs read back (`claims_grid`), the seams of the tokenization tax
(`seams`), and `bcr report`'s claims and HumanEval reports (`claims_report`, `humaneval_report`)."""
