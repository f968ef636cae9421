"""A Prometheus text endpoint for a running trainer (``profile.metrics_port``): rank 0 serves
``/metrics`` in the text exposition format (version 0.0.4) with the same figures it writes to
TensorBoard (loss, lr, gradient norm, tokens/s, the step's timers and breakdown, NVML utilisation,
memory and power) and the planner's prediction beside them, as gauges labelled with the run name.
Standard library only: a daemon thread, no dependency on prometheus_client.
"""

from __future__ import annotations

import math
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PREFIX = "reference_trainer_"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def metric_name(tag: str) -> str:
    """A TensorBoard tag as a Prometheus metric name: ``step_time_s/predicted`` ->
    ``reference_trainer_step_time_s_predicted`` ([a-zA-Z_:][a-zA-Z0-9_:]*)."""
    return PREFIX + re.sub(r"[^a-zA-Z0-9_]", "_", tag).strip("_")


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def exposition(scalars: dict[str, float | None], labels: dict[str, str], step: int | None = None) -> str:
    """The text exposition of finite gauges (None and non-finite values are left out)."""
    label = ",".join(f'{k}="{_label(v)}"' for k, v in sorted(labels.items()))
    items = dict(scalars)
    if step is not None:
        items["train/step"] = step
    lines = []
    for tag, value in sorted(items.items()):
        if value is None or not math.isfinite(float(value)):
            continue
        name = metric_name(tag)
        lines += [f"# TYPE {name} gauge", f"{name}{{{label}}} {float(value)!r}"]
    return "\n".join(lines) + "\n"


class MetricsServer:
    """Serves the latest gauges at http://HOST:PORT/metrics from a daemon thread."""

    def __init__(self, labels: dict[str, str]):
        self.labels, self._text, self._lock, self._server = labels, exposition({}, labels), threading.Lock(), None

    def start(self, port: int, host: str = "0.0.0.0") -> int:
        """Listen (port 0: any free port); returns the port."""
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404, "only /metrics here")
                    return
                body = server.text().encode()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # no access log on the training log
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True).start()
        return self._server.server_address[1]

    def update(self, scalars: dict[str, float | None], step: int) -> None:
        text = exposition(scalars, self.labels, step)
        with self._lock:
            self._text = text

    def text(self) -> str:
        with self._lock:
            return self._text

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
