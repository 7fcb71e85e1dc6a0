"""`sweep report`: a self-contained HTML page and PNG plots from a sweep's results and its plan."""

from sweeper.report.plots import *  # noqa: F403
