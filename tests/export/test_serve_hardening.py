"""nitro serve under hostile requests (issue 28, item 2), in process through httpx's
ASGI transport: the body and decoded-array limits hold before anything is
allocated, every malformed body is a 4xx with a message, NaN and infinite inputs
follow the contract, GET on :predict is a 405, every request is logged and so is
the shutdown; a fuzz over mutated bodies finds no 500."""

import asyncio
import io
import json
import logging
import zipfile

import httpx
import numpy as np
import pytest
from export_experiments import Exportable, quiet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

import jaxnitro as nx
from jaxnitro.cli import main
from jaxnitro.export.request_body import ServeLimits
from jaxnitro.export.server import create_app

PREDICT = "/v1/models/v1:predict"
NPY = "application/x-npy"
NPZ = "application/x-npz"
ROW = [0.5] * 8


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    nitro = nx.Nitro(Exportable(), **quiet())
    return nx.export_model(
        nitro,
        nx.StableHLOBundle(),
        dir=tmp_path_factory.mktemp("bundle"),
        name="v1",
        batch_sizes=[1, 4],
    )


@pytest.fixture(scope="module")
def app(path):
    return create_app(path, max_delay=0.0)


def run(app, *requests):
    """Send requests (method, url, keywords) through the ASGI app, in order."""

    async def send():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return [await c.request(method, url, **kw) for method, url, kw in requests]

    return asyncio.run(send())


def post(app, body, content_type="application/json", url=PREDICT, **kw):
    (r,) = run(
        app, ("POST", url, {"content": body, "headers": {"content-type": content_type}})
    )
    return r


def npy_header(shape, descr="<f4", version=(1, 0)):
    buffer = io.BytesIO()
    header = {"descr": descr, "fortran_order": False, "shape": shape}
    if version == (1, 0):
        np.lib.format.write_array_header_1_0(buffer, header)
    else:
        np.lib.format.write_array_header_2_0(buffer, header)
    return buffer.getvalue()


def npy(array):
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def npz(**arrays):
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def refused(r, status, match):
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert __import__("re").search(match, error), error
    return error


def test_an_npy_header_claiming_1e12_rows_is_refused_before_allocating(app):
    body = npy_header((10**12, 8)) + b"\x00" * 64
    refused(
        post(app, body, NPY),
        413,
        r"input 'x': 1000000000000 rows; this server takes at most 8192 a request "
        r"\(--max-rows\)",
    )
    # Rows within the limit, bytes past it: refused from the header too.
    small = create_app(
        app.state.bundle, warm_up=False, limits=ServeLimits(max_rows=10**9)
    )
    refused(
        post(small, npy_header((10**7, 8)), NPY),
        413,
        r"input 'x': shape \(10000000, 8\) decodes to 320000000 bytes, past the "
        r"67108864 \(64 MiB, --max-input-mb\)",
    )


@pytest.fixture(scope="module")
def bomb():
    """A 255 KiB .npz whose one member inflates to 256 MiB of float32 zeros."""
    buffer = io.BytesIO()
    with (
        zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z,
        z.open("x.npy", "w", force_zip64=True) as member,
    ):
        member.write(npy_header((8192, 8192)))
        chunk = bytes(2**20)
        for _ in range(256):
            member.write(chunk)
    return buffer.getvalue()


def test_a_small_npz_that_inflates_to_256_mb_is_refused(app, bomb):
    assert len(bomb) < 300 * 1024
    refused(
        post(app, bomb, NPZ),
        413,
        r"input 'x': shape \(8192, 8192\) decodes to 268435456 bytes, past the "
        r"67108864 \(64 MiB",
    )


def test_an_npz_member_longer_than_its_header_is_refused_unread(app):
    """The header says one row; the member inflates to megabytes after it."""
    buffer = io.BytesIO()
    with (
        zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z,
        z.open("x.npy", "w", force_zip64=True) as member,
    ):
        member.write(npy(np.zeros((1, 8), np.float32)))
        member.write(bytes(32 * 2**20))
    refused(
        post(app, buffer.getvalue(), NPZ),
        400,
        r"the .npz member 'x.npy' holds bytes past the array its header describes",
    )


def test_a_body_over_the_limit_is_refused_by_length_or_as_it_streams(app):
    body = b"[" * (50 * 2**20)  # 50 MB of '[': refused from its Content-Length
    refused(
        post(app, body),
        413,
        r"the body is 52428800 bytes; this server takes at most 16777216 \(16 MiB, "
        r"--max-body-mb\)",
    )
    chunk = b" " * 2**20
    sent = []

    def chunks(n):
        async def stream():  # no Content-Length: counted as it arrives
            for _ in range(n):
                sent.append(len(chunk))
                yield chunk

        return stream()

    (r,) = run(app, ("POST", PREDICT, {"content": chunks(50)}))
    refused(r, 413, r"the body is larger than 16777216 bytes; this server takes at")
    # The rest was read and dropped, so a real client reads the 413 rather than
    # a reset connection; a body past 4 times the limit is not read to its end.
    assert len(sent) == 50
    sent.clear()
    (r,) = run(app, ("POST", PREDICT, {"content": chunks(100)}))
    assert r.status_code == 413 and len(sent) == 65


def test_a_deeply_nested_json_body_is_a_400(app):
    body = b'{"inputs": {"x": ' + b"[" * 5000 + b"]" * 5000 + b"}}"
    refused(
        post(app, body),
        400,
        r"the body nests 5002 levels deep; at most 32 are accepted",
    )


def test_json_rows_and_sizes_are_checked_before_the_array_is_built(app):
    tight = create_app(
        app.state.bundle,
        warm_up=False,
        limits=ServeLimits(max_rows=3, max_input_bytes=4 * 8 * 8),
    )
    r, ok = run(
        tight,
        ("POST", PREDICT, {"json": {"inputs": {"x": [ROW] * 5}}}),
        ("POST", PREDICT, {"json": {"inputs": {"x": [ROW] * 3}}}),
    )
    refused(r, 413, r"input 'x': 5 rows; this server takes at most 3 a request")
    assert ok.status_code == 200
    tighter = create_app(
        app.state.bundle, warm_up=False, limits=ServeLimits(max_input_bytes=100)
    )
    (r,) = run(tighter, ("POST", PREDICT, {"json": {"inputs": {"x": [ROW] * 2}}}))
    refused(r, 413, r"input 'x': shape \(2, 8\) decodes to 128 bytes, past the 100")


MALFORMED = [
    (npz(x=np.zeros((2, 8), np.float32))[:-30], NPZ, r"not a readable .npz archive"),
    (npz(x=np.zeros((2, 8), np.float32))[:200], NPZ, r"not a readable .npz archive"),
    (b"PK\x05\x06" + bytes(18), NPZ, r"takes the inputs \['x'\]; missing \['x'\]"),
    (
        npy(np.zeros((2, 8), np.float32))[:-54],
        NPY,
        r"the .npy body for input 'x' is truncated: its header claims "
        r"float32\[2, 8\] \(64 bytes of data\), but 10 follow",
    ),
    (
        npy(np.zeros((2, 8), np.float32)) + b"tail",
        NPY,
        r"holds 4 bytes past the array its header describes",
    ),
    (npy_header((2, 8))[:20], NPY, r"truncated inside its header"),
    (
        npy_header((1, 8), version=(2, 0)).replace(b"\x02\x00", b"\x03\x00", 1),
        NPY,
        r"is an .npy of version 3.0",
    ),
    (
        b"\x93NUMPY\x01\x00\xff\xff" + b" " * 100,
        NPY,
        r"declares a header of 65535 bytes; at most 10000 are read",
    ),
    (npy(np.array(["a", "b"])), NPY, r"holds <U1 values; send numbers"),
    (npy_header((2, 8), descr="|O") + bytes(16), NPY, r"holds object values"),
    (npy(np.float32(1.0)), NPY, r"has shape \(\); an input is \(rows, \*sample"),
    (b'{"inputs": {"x": 1}}', "application/json", r"input 'x': got 1, but the"),
    (b"[1, 2]", "application/json", r'must be an object with an "inputs" object'),
    (b"\xff\xfe", "application/json", r"the body is not UTF-8 text"),
    (b'{"inputs": {"x": [[1e300] + 7]}}', "application/json", r"not valid JSON"),
    (
        json.dumps({"inputs": {"x": [[1e300] * 8]}}).encode(),
        "application/json",
        r"input 'x': 1e\+300 is out of the range of the bundle's float32\[batch, 8\]",
    ),
    (
        b'{"inputs": {"x": [[' + b"9" * 5000 + b"]]}}",
        "application/json",
        r"the body is not valid JSON \(Exceeds the limit",
    ),
    (b"x", "text/plain", r"Content-Type 'text/plain' is not one this server reads"),
]


@pytest.mark.parametrize(("body", "content_type", "match"), MALFORMED)
def test_malformed_bodies_are_400s_with_a_message(app, body, content_type, match):
    refused(post(app, body, content_type), 400, match)


NONFINITE = r"input 'x': 1 value is NaN or infinite \(the first at index \[0, 2\]\)"


def test_nonfinite_inputs_follow_the_bundle_contract(app, tmp_path):
    x = np.zeros((1, 8), np.float32)
    x[0, 2] = np.nan
    for body, content_type in [
        (b'{"inputs": {"x": [[0, 0, NaN, 0, 0, 0, 0, 0]]}}', "application/json"),
        (b'{"inputs": {"x": [[0, 0, 1e999, 0, 0, 0, 0, 0]]}}', "application/json"),
        (b'{"inputs": {"x": [[0, 0, -Infinity, 0, 0, 0, 0, 0]]}}', "application/json"),
        (npy(x), NPY),
        (npz(x=x), NPZ),
    ]:
        refused(post(app, body, content_type), 400, NONFINITE + r"; bundle 'v1'")

    class Allowing(Exportable):
        def export_inputs(self):
            return [nx.ExportSpec("x", "float32", (1, 8), nonfinite="allow")]

    nitro = nx.Nitro(Allowing(), **quiet())
    allowing = create_app(
        nx.export_model(nitro, nx.StableHLOBundle(), dir=tmp_path, name="v1"),
        warm_up=False,
    )
    r = post(allowing, b'{"inputs": {"x": [[0, 0, NaN, 0, 0, 0, 0, 0]]}}')
    assert r.status_code == 200, r.text
    assert "NaN" in r.text  # the output is NaN, written as JSON's NaN


def test_wrong_methods_are_405_and_unknown_paths_404_in_json(app):
    get, head, post_health, nowhere = run(
        app,
        ("GET", PREDICT, {}),
        ("PUT", PREDICT, {"content": b"{}"}),
        ("POST", "/healthz", {"content": b"{}"}),
        ("GET", "/v2/else", {}),
    )
    refused(
        get,
        405,
        r"GET /v1/models/v1:predict: predict takes POST with the inputs as its "
        r"body \(JSON, .npy or .npz\); GET /v1/models/v1 returns the manifest",
    )
    assert get.headers["allow"] == "POST"
    refused(head, 405, r"PUT /v1/models/v1:predict: predict takes POST")
    refused(post_health, 405, r"POST /healthz: this endpoint takes GET, HEAD\.")
    assert post_health.headers["allow"] == "GET, HEAD"
    refused(
        nowhere,
        404,
        r"no endpoint /v2/else; this server answers GET /healthz, GET "
        r"/v1/models/v1 and POST /v1/models/v1:predict",
    )


def test_every_request_is_logged_and_so_is_the_shutdown(path, caplog):
    caplog.set_level(logging.INFO, logger="jaxnitro.serve")
    app = create_app(path, warm_up=False)
    with TestClient(app, client=("10.1.2.3", 4567)) as client:
        assert client.get("/healthz").status_code == 200
        assert client.post(PREDICT, json={"inputs": {"x": [ROW]}}).status_code == 200
        assert client.get(PREDICT + "?a=%0Afake").status_code == 405
        assert client.post(PREDICT, content=b"[").status_code == 400
    lines = [r.getMessage() for r in caplog.records if r.name == "jaxnitro.serve"]
    assert len(lines) == 5, lines
    assert lines[0].startswith('10.1.2.3:4567 "GET /healthz" 200 ')
    assert lines[1].startswith('10.1.2.3:4567 "POST /v1/models/v1:predict" 200 ')
    assert lines[1].endswith(" ms")
    assert lines[2].startswith(
        '10.1.2.3:4567 "GET /v1/models/v1:predict?a=%0Afake" 405'
    )
    assert " 400 " in lines[3]
    assert lines[4] == (
        "nitro serve: 'v1' shutting down after 4 requests (1 program calls, 1 rows)"
    )
    assert app.state.requests == 4


def test_a_log_line_escapes_control_characters():
    from jaxnitro.export.server import _printable

    assert _printable("/a\nb\x1b[31m") == "/a\\nb\\x1b[31m"
    assert len(_printable("x" * 500)) == 200


def test_limits_are_validated_and_set_from_the_cli(path, capsys):
    with pytest.raises(nx.ConfigError, match=r"max_rows must be a whole number >= 1"):
        ServeLimits(max_rows=0)
    with pytest.raises(nx.ConfigError, match=r"max_body_bytes must be a whole number"):
        ServeLimits(max_body_bytes=1.5)
    with pytest.raises(nx.ConfigError, match=r"limits=\{\} is not a ServeLimits"):
        create_app(path, limits={}, warm_up=False)
    assert main(["serve", path, "--max-body-mb", "0"]) == 1
    assert (
        "nitro serve: ServeLimits: max_body_bytes must be a whole number >= 1, got 0."
        in capsys.readouterr().err
    )


def test_a_program_failing_its_warm_up_is_a_named_bundle_error(path, monkeypatch):
    model = nx.load_bundle(path)

    def broken(**inputs):
        raise RuntimeError("INVALID_ARGUMENT: bad module")

    monkeypatch.setattr(type(model), "__call__", lambda self, **kw: broken(**kw))
    with pytest.raises(
        nx.export.BundleProgramError,
        match=r"the program .*program_b1.jaxexport for batch size 1 fails on zeros "
        r"\(RuntimeError: INVALID_ARGUMENT: bad module\)",
    ):
        create_app(model)


def mutated(valid: bytes, data) -> bytes:
    """`valid` with a few bytes flipped, cut or inserted (Hypothesis draws them)."""
    body = bytearray(valid)
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        at = data.draw(st.integers(0, max(len(body) - 1, 0)))
        if kind == "flip" and body:
            body[at] ^= data.draw(st.integers(1, 255))
        elif kind == "cut":
            del body[at : at + data.draw(st.integers(1, 64))]
        else:
            body[at:at] = data.draw(st.binary(min_size=1, max_size=16))
    return bytes(body)


VALID = {
    NPY: npy(np.ones((3, 8), np.float32)),
    NPZ: npz(x=np.ones((3, 8), np.float32)),
    "application/json": json.dumps({"inputs": {"x": [ROW] * 3}}).encode(),
}


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_fuzz_no_mutated_body_gets_a_500(app, data):
    content_type = data.draw(st.sampled_from(sorted(VALID)))
    body = mutated(VALID[content_type], data)
    r = post(app, body, content_type)
    assert r.status_code in (200, 400, 413), (r.status_code, r.text, body[:100])
    assert r.headers["content-type"] == "application/json"
    if r.status_code != 200:
        assert r.json()["error"]
