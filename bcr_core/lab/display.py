"""What every notebook calls inside its kernel: `setup`, the display settings it starts with, and
`static_copy`, a live figure's static copy for the HTML report (left out in the app).
"""

from __future__ import annotations

import os


def setup() -> None:
    """Display settings every notebook starts with: plotly figures that show both in JupyterLab
    and in the HTML export (plotly.js embedded once per page), and compact pandas tables."""
    import pandas as pd
    import plotly.io as pio

    pio.renderers.default = "plotly_mimetype+notebook"
    pd.set_option("display.html.use_mathjax", False)  # "$500 ... $20" in a question is money, not TeX
    pd.set_option("display.precision", 3)
    pd.set_option("display.max_colwidth", 120)
    pd.set_option("display.max_columns", 40)


APP = "BCR_APP"  # set in the kernel's environment by `bcr explore` (bcr_core.lab.app)


def static_copy(figure) -> None:
    """Show a static copy of a live figure, for the HTML report. Left out in the app, which shows the
    live figure and runs offline (the copy's HTML would load MathJax from a CDN)."""
    import plotly.graph_objects as go

    if not os.environ.get(APP):
        go.Figure(figure).show()
