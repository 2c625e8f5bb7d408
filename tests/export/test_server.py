"""nitro serve: the HTTP endpoints in process (httpx's ASGI transport), dynamic
batching, malformed requests, and a real server process on loopback under a bounded
load (slow tier)."""

import asyncio
import io
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest
from experiments import make_batches
from export_experiments import Exportable, Rich, quiet

import jaxnitro as nx
from jaxnitro.cli import main
from jaxnitro.export.batching import DynamicBatcher
from jaxnitro.export.server import create_app

PREDICT = "/v1/models/v1:predict"
NPY = "application/x-npy"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A handle, its bundle (batch sizes 1 and 4) and an app serving it."""
    nitro = nx.Nitro(Exportable(), **quiet())
    path = nx.export_model(
        nitro,
        nx.StableHLOBundle(),
        dir=tmp_path_factory.mktemp("bundle"),
        name="v1",
        batch_sizes=[1, 4],
    )
    return nitro, path, create_app(path, max_delay=0.05)


def run(app, *requests):
    """Send requests (method, url, keywords) concurrently through the ASGI app."""

    async def send():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return await asyncio.gather(
                *(c.request(method, url, **kw) for method, url, kw in requests)
            )

    return asyncio.run(send())


def npy(array):
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


@pytest.mark.needs_sockets("pair")  # an asyncio event loop: a socketpair
def test_json_predict_matches_predict(served):
    nitro, _, app = served
    x = make_batches(3, 3, seed=4)[0]["x"]
    (r,) = run(app, ("POST", PREDICT, {"json": {"inputs": {"x": x.tolist()}}}))
    assert r.status_code == 200, r.text
    logits = np.asarray(r.json()["outputs"]["logits"], np.float32)
    np.testing.assert_allclose(logits, nitro.predict({"x": x}), rtol=1e-5, atol=1e-6)


@pytest.mark.needs_sockets("pair")
def test_npy_and_npz_bodies_and_an_npy_answer(served):
    nitro, _, app = served
    x = make_batches(9, 9, seed=5)[0]["x"].astype(np.float32)  # past max_batch
    archive = io.BytesIO()
    np.savez(archive, x=x[:2])
    raw, named, npz = run(
        app,
        ("POST", PREDICT, {"content": npy(x), "headers": {"content-type": NPY}}),
        (
            "POST",
            PREDICT + "?input=x",
            {
                "content": npy(x[:5]),
                "headers": {"content-type": NPY, "accept": NPY},
            },
        ),
        (
            "POST",
            PREDICT,
            {
                "content": archive.getvalue(),
                "headers": {"content-type": "application/x-npz"},
            },
        ),
    )
    expected = nitro.predict({"x": x})
    got = np.asarray(raw.json()["outputs"]["logits"], np.float32)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert named.headers["content-type"] == NPY
    got = np.load(io.BytesIO(named.content))
    assert got.dtype == np.float32 and got.shape == (5, 3)
    np.testing.assert_allclose(got, expected[:5], rtol=1e-5, atol=1e-6)
    got = np.asarray(npz.json()["outputs"]["logits"], np.float32)
    np.testing.assert_allclose(got, expected[:2], rtol=1e-5, atol=1e-6)


@pytest.mark.needs_sockets("pair")
def test_health_manifest_and_unknown_model(served):
    _, path, app = served
    health, manifest, unknown, unknown_post = run(
        app,
        ("GET", "/healthz", {}),
        ("GET", "/v1/models/v1", {}),
        ("GET", "/v1/models/v2", {}),
        ("POST", "/v1/models/v2:predict", {"json": {"inputs": {}}}),
    )
    assert health.json()["status"] == "ok" and health.json()["model"] == "v1"
    assert health.json()["rows"] >= health.json()["batches"] >= 0
    with open(os.path.join(path, "manifest.json")) as f:
        assert manifest.json() == json.load(f)
    assert manifest.json()["batch_sizes"] == [1, 4]
    for r in (unknown, unknown_post):
        assert r.status_code == 404
        assert r.json()["error"] == "no model 'v2' here; this server serves 'v1'."


ROW = [0.5] * 8
BAD = [
    ({"json": {"inputs": {"y": [ROW]}}}, r"missing \['x'\], unknown \['y'\]"),
    (
        {"json": {"inputs": {"x": [ROW[:7]]}}},
        r"input 'x': shape \(1, 7\) does not match the bundle's float32\[batch, 8\]",
    ),
    (
        {"json": {"inputs": {"x": [["a"] * 8]}}},
        r"input 'x': got <U1 values, but the bundle takes float32\[batch, 8\]",
    ),
    (
        {"json": {"inputs": {"x": [ROW, ROW[:3]]}}},
        r"input 'x': the nested lists are not rectangular",
    ),
    ({"content": b'{"inputs": '}, r"the body is not valid JSON"),
    ({"json": {"x": [ROW]}}, r'must be an object with an "inputs" object.*"x":'),
    (
        {
            "content": npy(np.zeros((2, 8), np.float64)),
            "headers": {"content-type": "application/x-npy"},
        },
        r"input 'x': dtype float64 does not cast safely to the bundle's float32",
    ),
    (
        {"content": b"not npy", "headers": {"content-type": "application/x-npy"}},
        r"the .npy body for input 'x' is not a readable .npy array",
    ),
    (
        {"content": b"x", "headers": {"content-type": "text/plain"}},
        r"Content-Type 'text/plain' is not one this server reads",
    ),
    (
        {"json": {"inputs": {"x": [ROW]}}, "headers": {"accept": "application/x-npy"}},
        None,  # one output: the npy answer needs no ?output=
    ),
    (
        {
            "content": json.dumps({"inputs": {"x": [ROW]}}),
            "headers": {"content-type": "application/x-www-form-urlencoded"},
        },
        None,  # curl -d's default Content-Type: read as JSON
    ),
]


@pytest.mark.needs_sockets("pair")
@pytest.mark.parametrize(("request_kw", "message"), BAD)
def test_malformed_requests_get_400_naming_the_input(served, request_kw, message):
    _, _, app = served
    (r,) = run(app, ("POST", PREDICT, request_kw))
    if message is None:
        assert r.status_code == 200, r.text
        if r.headers["content-type"] == NPY:
            assert np.load(io.BytesIO(r.content)).shape == (1, 3)
        else:
            assert np.asarray(r.json()["outputs"]["logits"]).shape == (1, 3)
        return
    assert r.status_code == 400
    assert r.headers["content-type"] == "application/json"
    assert re.search(message, r.json()["error"]), r.json()["error"]


@pytest.mark.needs_sockets("pair")
def test_integer_inputs_refuse_fractions_and_out_of_range_values(tmp_path):
    nitro = nx.Nitro(Rich(), **quiet())
    path = nx.export_model(nitro, nx.StableHLOBundle(), dir=tmp_path, name="v1")
    app = create_app(path, warm_up=False)
    pixels = np.arange(16, dtype=np.uint8).reshape(2, 8)
    frac, big, good, multi = run(
        app,
        ("POST", PREDICT, {"json": {"inputs": {"pixels": [[1.5] * 8]}}}),
        ("POST", PREDICT, {"json": {"inputs": {"pixels": [[300] * 8]}}}),
        ("POST", PREDICT, {"json": {"inputs": {"pixels": pixels.tolist()}}}),
        (
            "POST",
            PREDICT,
            {
                "json": {"inputs": {"pixels": [[1] * 8]}},
                "headers": {"accept": "application/x-npy"},
            },
        ),
    )
    assert frac.status_code == big.status_code == multi.status_code == 400
    assert frac.json()["error"] == (
        "input 'pixels': got fractions, but the bundle takes uint8[batch, 8]; "
        "send numbers of that type."
    )
    assert big.json()["error"] == (
        "input 'pixels': values from 300 to 300 do not fit the bundle's "
        "uint8[batch, 8] (range 0..255)."
    )
    assert (
        "name it with ?output=NAME, one of ['scores', 'top', 'pixels_echo']"
        in (multi.json()["error"])
    )
    out = good.json()["outputs"]
    assert out["pixels_echo"] == pixels.tolist()
    expected = nitro.predict({"x": pixels.astype(np.float32) / 255})
    np.testing.assert_allclose(out["scores"], expected["logits"], rtol=1e-5, atol=1e-6)
    assert out["top"] == np.asarray(expected["top"]).tolist()


@pytest.mark.needs_sockets("pair")
def test_concurrent_requests_are_batched_and_split_back(served):
    nitro, _, app = served
    x = make_batches(10, 10, seed=6)[0]["x"]
    before = len(app.state.batcher.calls)
    responses = run(
        app,
        *(("POST", PREDICT, {"json": {"inputs": {"x": [row.tolist()]}}}) for row in x),
    )
    calls = app.state.batcher.calls[before:]
    assert sum(calls) == 10 and max(calls) == 4 and len(calls) < 10
    got = np.concatenate(
        [np.asarray(r.json()["outputs"]["logits"], np.float32) for r in responses]
    )
    np.testing.assert_allclose(got, nitro.predict({"x": x}), rtol=1e-5, atol=1e-6)


@pytest.mark.needs_sockets("pair")
def test_batcher_pads_to_an_exported_size_and_passes_errors_on():
    seen = []

    def model(x):
        seen.append(x.shape[0])
        if (x < 0).any():
            raise RuntimeError("negative input")
        return {"y": 2 * x}

    async def go():
        batcher = DynamicBatcher(model, batch_sizes=[2, 8], max_delay=0.05)
        rows = [np.full((n, 1), n, np.float32) for n in (1, 2, 3, 9)]
        outs = await asyncio.gather(*(batcher.submit({"x": r}) for r in rows))
        failed = await asyncio.gather(
            batcher.submit({"x": -np.ones((1, 1))}),
            batcher.submit({"x": np.ones((1, 1))}),
            return_exceptions=True,
        )
        await batcher.aclose()
        return rows, outs, failed, batcher.calls

    rows, outs, failed, calls = asyncio.run(go())
    for r, out in zip(rows, outs, strict=True):
        np.testing.assert_array_equal(out["y"], 2 * r)
    assert calls[:2] == [6, 9]  # 1+2+3 merged (9 rows would pass 8), 9 alone
    assert seen[:2] == [8, 9]  # 6 rows padded to the exported 8; 9 past the largest
    assert all(isinstance(f, RuntimeError) for f in failed)
    with pytest.raises(nx.ConfigError, match="max_delay must be >= 0, got -1"):
        DynamicBatcher(model, batch_sizes=[1], max_delay=-1)
    with pytest.raises(nx.ConfigError, match=r"batch_sizes must be positive.*\[0\]"):
        DynamicBatcher(model, batch_sizes=[0])


def test_without_the_serve_extra_the_error_names_it(served, monkeypatch):
    monkeypatch.setitem(sys.modules, "starlette", None)
    with pytest.raises(nx.MissingExtraError, match=r"pip install 'jaxnitro\[serve\]'"):
        create_app(served[1])


def test_cli_serve_refuses_a_folder_that_is_no_bundle(tmp_path, capsys):
    assert main(["serve", str(tmp_path), "--port", "1"]) == 1
    assert f"nitro serve: load_bundle: {tmp_path}" in capsys.readouterr().err


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CLIENTS, SECONDS, MAX_REQUESTS = 16, 8.0, 20_000


@pytest.mark.needs_processes
@pytest.mark.needs_sockets
@pytest.mark.slow
def test_a_server_process_on_loopback_under_a_bounded_load(tmp_path):
    nitro = nx.Nitro(Exportable(), **quiet())
    path = nx.export_model(
        nitro, nx.StableHLOBundle(), dir=tmp_path, name="v1", batch_sizes=[1, 8, 16]
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "server.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "jaxnitro.cli", "serve", path, "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "the server was not healthy in 120 s"
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        x = make_batches(5, 5, seed=7)[0]["x"]
        r = httpx.post(url + PREDICT, json={"inputs": {"x": x.tolist()}}, timeout=30)
        logits = np.asarray(r.json()["outputs"]["logits"], np.float32)
        np.testing.assert_allclose(
            logits, nitro.predict({"x": x}), rtol=1e-5, atol=1e-6
        )

        latencies: list[float] = []
        errors: list[str] = []
        lock = threading.Lock()
        stop = time.monotonic() + SECONDS
        body = json.dumps({"inputs": {"x": [x[0].tolist()]}})
        expected = nitro.predict({"x": x[:1]})

        def client():
            with httpx.Client(base_url=url, timeout=10) as c:
                while time.monotonic() < stop and len(latencies) < MAX_REQUESTS:
                    t = time.perf_counter()
                    try:
                        r = c.post(PREDICT, content=body)
                        out = np.asarray(r.json()["outputs"]["logits"], np.float32)
                        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
                    except Exception as error:  # counted, reported below
                        with lock:
                            errors.append(repr(error))
                        continue
                    with lock:
                        latencies.append(time.perf_counter() - t)

        started = time.monotonic()
        threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=SECONDS + 30)
        elapsed = time.monotonic() - started
        health = httpx.get(url + "/healthz", timeout=10).json()
        assert not any(t.is_alive() for t in threads)
        assert errors == [], errors[:3]
        ms = np.percentile(np.asarray(latencies) * 1e3, [50, 99])
        print(
            f"\nload: {CLIENTS} clients, {elapsed:.1f} s, {len(latencies)} requests, "
            f"{len(errors)} errors, p50 {ms[0]:.1f} ms, p99 {ms[1]:.1f} ms, "
            f"{len(latencies) / elapsed:.0f} requests/s, {health['batches']} "
            f"program calls ({health['rows'] / health['batches']:.1f} rows each)"
        )
        assert health["rows"] == len(latencies) + 5  # +5: the correctness check
        assert health["batches"] < health["rows"]  # requests were batched
        assert len(latencies) > CLIENTS
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=15)
    # The access log: a line per request; SIGTERM: a shutdown line with the count.
    lines = log_path.read_text().splitlines()
    predicts = [line for line in lines if '"POST /v1/models/v1:predict" 200' in line]
    assert len(predicts) == len(latencies) + 1
    assert re.search(
        rf"nitro serve: 'v1' shutting down after \d+ requests \(\d+ program calls, "
        rf"{health['rows']} rows\)",
        lines[-1],
    ), lines[-3:]


class Two(Exportable):
    """Two wire inputs: x scaled by w per sample."""

    def export_inputs(self):
        return [
            nx.ExportSpec("x", "float32", (1, 8)),
            nx.ExportSpec("w", "float32", (1,)),
        ]

    def export_preprocess(self, x, w):
        return {"x": x * w[:, None]}


@pytest.mark.needs_sockets("pair")
def test_a_two_input_bundle_takes_npz_and_refuses_an_unnamed_npy(tmp_path):
    nitro = nx.Nitro(Two(), **quiet())
    path = nx.export_model(nitro, nx.StableHLOBundle(), dir=tmp_path, name="v1")
    app = create_app(path, warm_up=False)
    x = np.ones((3, 8), np.float32)
    w = np.asarray([1.0, 2.0, 3.0], np.float32)
    archive = io.BytesIO()
    np.savez(archive, x=x, w=w)
    npz, unnamed, broken, disagree = run(
        app,
        (
            "POST",
            PREDICT,
            {
                "content": archive.getvalue(),
                "headers": {"content-type": "application/x-npz"},
            },
        ),
        ("POST", PREDICT, {"content": npy(x), "headers": {"content-type": NPY}}),
        (
            "POST",
            PREDICT,
            {"content": b"PK no zip", "headers": {"content-type": "application/x-npz"}},
        ),
        ("POST", PREDICT, {"json": {"inputs": {"x": x.tolist(), "w": [1.0]}}}),
    )
    got = np.asarray(npz.json()["outputs"]["logits"], np.float32)
    expected = nitro.predict({"x": x * w[:, None]})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert unnamed.status_code == broken.status_code == disagree.status_code == 400
    assert unnamed.json()["error"] == (
        "a .npy body is one input; bundle 'v1' takes ['x', 'w']: name it with "
        "?input=NAME, or send them all as one .npz (application/x-npz)."
    )
    assert "the body is not a readable .npz archive" in broken.json()["error"]
    assert "the inputs disagree on the batch size" in disagree.json()["error"]
    with pytest.raises(nx.ConfigError, match="max_batch must be >= 1, got 0"):
        create_app(path, max_batch=0, warm_up=False)


@pytest.mark.needs_sockets("pair")
def test_a_failing_program_answers_500_naming_the_model(served, monkeypatch):
    _, _, app = served

    def broken(**inputs):
        raise RuntimeError("device lost")

    monkeypatch.setattr(app.state.batcher, "model", broken)
    (r,) = run(app, ("POST", PREDICT, {"json": {"inputs": {"x": [ROW]}}}))
    assert r.status_code == 500
    assert r.json()["error"] == (
        "model 'v1' failed on this batch: RuntimeError('device lost')"
    )
