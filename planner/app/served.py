"""The script `planner app` serves. Streamlit runs a served file anew, as a fresh ``__main__``
module, on every page run: the page itself served so would lose its module's state between runs
(the once-per-process warm-up and heap freeze, the Runs tab's view built ahead). Here the page's
module is imported once per process and its ``main`` run on each page run, as `streamlit run
app.py` from a checkout does."""

from planner.app.page import main

main()
