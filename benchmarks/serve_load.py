"""`nitro serve` under a bounded load on loopback: 8 clients x 100 requests.

Exports the tutorial-sized MLP (784-128-10, untrained weights: the figures are the
server's, not the model's) as a bundle with batch sizes 1 and 8, starts `nitro serve`
in a child process on 127.0.0.1 (a free port, nothing else is reachable), waits for
`/healthz`, then runs CLIENTS threads, each sending REQUESTS sequential JSON predict
requests of one row. It prints how many answered 200 with the right logits, the p50
and p99 latency, the request rate and how many program calls served them, then stops
the server (SIGTERM) and shows the server's first log line (the address it listened
on) and its last ones (the access log is on; the last is its shutdown line).

Bounded: every request has a 10 s timeout, the server must be healthy in 120 s, and
the client threads are joined with a deadline. It runs on the CPU on any machine
(`JAX_PLATFORMS=cpu` for this process and the server's): two processes cannot share a
TPU chip, and this one exports the bundle.

    python benchmarks/serve_load.py                  # 8 clients x 100 requests
    python benchmarks/serve_load.py --clients 4 --requests 50
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

from _common import WORKLOADS, banner, make_experiment, synthetic_batches


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def export_bundle(folder: str) -> tuple[str, list[float], list[float]]:
    """The bundle's path, one input row and the logits `predict` gives for it."""
    import jaxnitro as nx

    widths, _, _ = WORKLOADS["tutorial_mlp"]
    batches = synthetic_batches(8, 1)
    bench = make_experiment(widths, batches)

    class Served(bench):  # type: ignore[misc, valid-type]
        def export_inputs(self):
            return [nx.ExportSpec("x", "float32", (1, widths[0]))]

        def export_outputs(self):
            return [nx.ExportSpec("logits")]

    nitro = nx.Nitro(Served(), logger=None, checkpointer=None)
    path = nx.export_model(
        nitro, nx.StableHLOBundle(), dir=folder, name="v1", batch_sizes=[1, 8]
    )
    x = batches[0]["x"][:1]
    return path, x[0].tolist(), nitro.predict({"x": x})[0].tolist()


def measure(clients: int, requests: int) -> dict:
    """Start the server, run the load, stop the server; the figures."""
    import httpx
    import numpy as np

    with tempfile.TemporaryDirectory() as folder:
        path, row, expected = export_bundle(folder)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log_path = os.path.join(folder, "server.log")
        with open(log_path, "w") as log:
            server = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "jaxnitro.cli",
                    "serve",
                    path,
                    "--host",
                    "127.0.0.1",  # loopback only, whatever the CLI's default
                    "--port",
                    str(port),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            deadline = time.monotonic() + 120
            while True:
                if server.poll() is not None or time.monotonic() > deadline:
                    with open(log_path) as f:
                        raise RuntimeError(f.read())
                try:
                    if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.2)
            body = json.dumps({"inputs": {"x": [row]}})
            latencies: list[float] = []
            failures: list[str] = []
            lock = threading.Lock()

            def client() -> None:
                with httpx.Client(base_url=url, timeout=10) as c:
                    for _ in range(requests):
                        t = time.perf_counter()
                        try:
                            r = c.post("/v1/models/v1:predict", content=body)
                            got = r.json()["outputs"]["logits"][0]
                            np.testing.assert_allclose(
                                got, expected, rtol=1e-5, atol=1e-6
                            )
                        except Exception as error:  # counted and shown
                            with lock:
                                failures.append(repr(error))
                            continue
                        with lock:
                            latencies.append(time.perf_counter() - t)

            started = time.perf_counter()
            threads = [threading.Thread(target=client) for _ in range(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=requests * 10 + 30)
            elapsed = time.perf_counter() - started
            health = httpx.get(url + "/healthz", timeout=10).json()
        finally:
            server.terminate()
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(timeout=15)
        with open(log_path) as f:
            lines = f.read().splitlines()
        shown = lines[:1] + lines[max(1, len(lines) - 3) :]  # start, then the end
    ms = np.percentile(np.asarray(latencies) * 1e3, [50, 99]) if latencies else [0, 0]
    return {
        "ok": len(latencies),
        "sent": clients * requests,
        "failures": failures[:3],
        "p50_ms": float(ms[0]),
        "p99_ms": float(ms[1]),
        "rate": len(latencies) / elapsed,
        "batches": health["batches"],
        "rows": health["rows"],
        "server_log": shown,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=100, help="per client")
    args = parser.parse_args()
    os.environ["JAX_PLATFORMS"] = "cpu"  # before JAX starts; the server inherits it
    print(banner(), flush=True)
    got = measure(args.clients, args.requests)
    print(
        f"{args.clients} clients x {args.requests} requests: "
        f"{got['ok']}/{got['sent']} answered correctly, p50 {got['p50_ms']:.1f} ms, "
        f"p99 {got['p99_ms']:.1f} ms, {got['rate']:.0f} requests/s, "
        f"{got['batches']} program calls for {got['rows']} rows"
    )
    for line in got["failures"]:
        print(f"  failure: {line}")
    for line in got["server_log"]:
        print(f"  server: {line}")


if __name__ == "__main__":
    main()
