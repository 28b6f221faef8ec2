"""Reading run records: paired statistics (`stats`), a run's summary table (`summary`), the claims'
protocol and tests (`inference`, `protocol`, `claims`), the claims' grid of runs (`claims_grid`)
and its verdict report (`claims_report`)."""
