"""Reading run records, in three layers, each importing only the ones below it:

- `statistics`: tests, intervals, power and Monte-Carlo p values that know nothing of the lab;
- `claims`: the paper's claims as families of tests read from item and call records (the protocol,
  the synthetic and HumanEval families, the tax, Equation 3's line, transfer, confirmation, sizing);
- `reports`: loading run folders, the tables every command and notebook prints, and the reports
  `bcr report` runs.
"""
