"""`planner app`'s server: Streamlit's own command line (`python -m planner.app.serve run served.py
...` is `streamlit run served.py ...`), started after a background thread that imports what the
explorer's first page and a visitor's first clicks need (the page's modules, pandas for the first
table, the other tabs' modules, the profile names, the Runs tab's default view), so the first
visitor does not wait for them.
"""

from __future__ import annotations

# What the page and its tabs import the first time they draw; pandas first (Streamlit converts every
# table through it: the first table's click waits for it), then the page's own modules.
WARM_MODULES = ("pandas", "planner.app.page", "pyarrow.compute", "yaml", "planner.calibration.validate",
                "planner.app.live", "planner.app.charts", "planner.export.formats", "planner.export.render",
                "planner.decisions.pictures")


def warm_up() -> None:
    """Import WARM_MODULES (an optional one missing is left to the tab that needs it, which says so),
    read the MIME tables and the profile names once, and build the Runs tab's default view
    (planner.app.runs.warm_runs)."""
    import importlib

    for name in WARM_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    import mimetypes

    mimetypes.init()  # the system's MIME tables, read at the Export tab's download button's first use (5-7 ms)
    from planner.app import explore

    explore.profile_names()
    explore._gpu_profile_names()
    from planner.app.runs import warm_runs

    warm_runs()  # the Runs tab's default view, before a visitor opens the tab


def start_warm_up():
    """``warm_up`` in a background thread (a daemon: the server's exit does not wait for it)."""
    import threading

    thread = threading.Thread(target=warm_up, name="planner-server-warm-up", daemon=True)
    thread.start()
    return thread


def main() -> None:
    """Streamlit's command line with this process's arguments, the warm-up begun first."""
    start_warm_up()
    from streamlit.web.cli import main as streamlit_main

    streamlit_main(prog_name="streamlit")


if __name__ == "__main__":
    main()
