"""Running: the named conditions (`conditions`), one `bcr run` cell under them (`runner`), batched
lanes of requests (`lanes`) and grids of cells in this process or on Ray (`grid`, `grid_ray`)."""
