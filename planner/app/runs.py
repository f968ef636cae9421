"""The explorer's Runs tab's data: the default runs folder, its records' signature, the view the tab
draws (the comparison of predicted and measured, as Arrow tables and a chart), and that view built
ahead of a visitor by the warm-up threads (planner.app.serve at the server's start, else the page
after its first run), once per process, for the page's cached functions to take (``WARMED``)."""

from __future__ import annotations

from dataclasses import dataclass

from planner.calibration import run_records


def default_runs_folder() -> str:
    """runs/ where runs were made, else the committed CPU runs (so the tab never starts empty)."""
    from pathlib import Path

    if Path("runs").is_dir():
        return "runs"
    committed = Path(run_records.__file__).resolve().parents[2] / "benchmarks" / "runs" / "cpu-2core"
    if not committed.is_dir():
        return "runs"
    try:
        return str(committed.relative_to(Path.cwd()))
    except ValueError:
        return str(committed)


def records_signature(folder: str) -> tuple:
    """What the runs of a folder depend on: each record's path, size and modification time (a
    record rewritten or still being written reads again)."""
    from pathlib import Path

    out = []
    for path in sorted(Path(folder).rglob("record.json")):
        try:
            st_ = path.stat()
        except OSError:
            continue
        out.append((str(path), st_.st_size, st_.st_mtime_ns))
    return tuple(out)


# The Runs tab's default view, built by a warm-up thread (``warm_runs``) before a visitor opens the
# tab: (folder, signature) -> its runs; (folder, signature, profile) -> its view. The page's cached
# functions (planner.app.page.cached_runs, cached_runs_view) take their value from here once.
WARMED: dict[tuple, object] = {}


def warm_runs() -> None:
    """The Runs tab's view of the default folder on its default profile, built ahead (into
    ``WARMED``), once per process (planner.app.serve.warm_up: as `planner app`'s server starts, else
    after the page's first run). The first open of the tab then reads no record and predicts no run
    (30-60 ms). A folder refused, empty or failing is left to the tab, which says why."""
    if _STARTED:
        return
    _STARTED.append(True)
    try:
        _warm_runs()
    except Exception:  # noqa: BLE001 (the tab builds the view itself when opened, and shows what failed)
        WARMED.clear()


_STARTED: list[bool] = []  # set once ``warm_runs`` has begun in this process


def _warm_runs() -> None:
    from planner.app.explore import profile_names

    folder = default_runs_folder()
    if run_records.runs_folder_problem(folder):
        return
    signature = records_signature(folder)
    found = run_records.load_folder(folder)
    WARMED[folder, signature] = found
    if found.runs:
        profiles = list(profile_names())
        default = run_records.default_profile(found.runs, profiles)
        profile = default if default in profiles else None  # the tab's own choice ("as recorded": None)
        WARMED[folder, signature, profile] = runs_view(found.runs, profile)


@dataclass(frozen=True)
class RunsView:
    """What the Runs tab draws for one folder state and profile, built once: the comparison, its
    tables as Arrow (st.dataframe sends a list of rows through pandas on every run) and its chart
    with the data as Arrow bytes (a named dataset Streamlit passes on as it is)."""

    compared: object  # run_records.Compared
    runs_table: object  # pyarrow.Table
    points_table: object | None
    chart: dict | None


def runs_view(runs: tuple, profile: str | None) -> RunsView:
    import pyarrow as pa
    from streamlit import dataframe_util

    from planner.app import charts

    compared = run_records.compare(runs, profile)
    chart = None
    if compared.points:
        spec = charts.predicted_vs_measured(compared.points)
        rows = spec.pop("data")["values"]
        chart = {**spec, "data": {"name": "points"},
                 "datasets": {"points": dataframe_util.convert_anything_to_arrow_bytes(rows)}}
    return RunsView(compared=compared, runs_table=pa.Table.from_pylist(run_records.run_rows(runs)),
                    points_table=pa.Table.from_pylist(run_records.point_rows(compared.points))
                    if compared.points else None, chart=chart)
