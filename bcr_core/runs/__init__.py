"""Running: the named conditions (`conditions`), `bcr run`'s settings (`settings`), one cell
(`cell`) run under them (`runner`) into its folder of records (`run_files`), batched lanes of
requests (`lanes`), and grids of cells (`grid_cells`) run in this process (`grid`) or on Ray
(`grid_ray`)."""
