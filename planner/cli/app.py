"""`planner app`: serves the what-if explorer (the page planner/app/page.py, inside the package, through
planner/app/served.py).

Registered through planner.cli.main.EXTENSIONS; imports nothing heavy until it runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

EXIT_BAD_INPUT = 2


def app_path() -> Path | None:
    """The script that serves the page, inside the installed package (works after a plain `pip
    install .`): planner/app/served.py, which runs the page's module (planner/app/page.py)."""
    path = Path(__file__).resolve().parent.parent / "app" / "served.py"
    return path if path.is_file() else None


def add_parser(sub) -> None:
    p = sub.add_parser("app", help="open the what-if explorer in a browser (Streamlit)")
    p.add_argument("--port", type=int, default=8501, help="port to serve on (default 8501)")
    p.add_argument("--address", default="localhost", help="address to listen on (default localhost)")
    p.add_argument("--headless", action="store_true", help="do not open a browser")
    p.set_defaults(func=run)


def streamlit_command(args: argparse.Namespace, app: Path) -> list[str]:
    """`streamlit run` through planner.app.serve (Streamlit's own command line, begun after a thread
    that imports what the first page and the first clicks need). Always headless: a non-headless
    Streamlit asks for an e-mail address on its first run and waits at the prompt (or exits 255
    without a terminal). ``open_browser`` opens the page instead."""
    return [sys.executable, "-m", "planner.app.serve", "run", str(app), "--server.port", str(args.port),
            "--server.address", args.address, "--server.headless", "true",
            "--browser.gatherUsageStats", "false", "--client.toolbarMode", "minimal"]


def headless(args: argparse.Namespace) -> bool:
    """No browser is opened with --headless or when no person is at a terminal."""
    return args.headless or not (sys.stdin.isatty() and sys.stdout.isatty())


def open_browser(url: str, timeout_s: float = 60.0) -> None:
    """Open ``url`` in a browser once the server answers its health check (or give up quietly)."""
    import time
    import urllib.request
    import webbrowser

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.read().strip() == b"ok":
                    webbrowser.open(url)
                    return
        except OSError:
            time.sleep(0.3)


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.port <= 65535:
        print(f"planner app: port={args.port}: 1 to 65535", file=sys.stderr)
        return EXIT_BAD_INPUT
    if importlib.util.find_spec("streamlit") is None:
        print("planner app: streamlit is not installed; pip install -e '.[app]'", file=sys.stderr)
        return EXIT_BAD_INPUT
    app = app_path()
    if app is None:
        print("planner app: planner/app/page.py is missing from the installed package; reinstall it",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    cmd = streamlit_command(args, app)
    url = f"http://{'localhost' if args.address in ('0.0.0.0', '::') else args.address}:{args.port}"
    print(f"planner app: serving the explorer at {url}", file=sys.stderr)
    if os.name == "posix":  # become the server: a signal to `planner app` reaches streamlit itself
        if not headless(args) and os.fork() == 0:  # a person at a terminal: open the page when it is up
            open_browser(url)
            os._exit(0)
        os.execv(cmd[0], cmd)
    try:
        return subprocess.call(cmd)
    except KeyboardInterrupt:
        return 0
