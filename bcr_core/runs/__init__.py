"""Running: `bcr run`'s settings (`run_settings`), one cell (`cell`) run under them (`runner`)
into its folder of records (`run_writer`), batched lanes of requests (`lanes`), and grids of cells
(a grid file's cells `grid_file`, one cell's run `grid_task`, what the output folder holds
`grid_folder`) run in this process (`grid`) or on Ray (`grid_ray`)."""
