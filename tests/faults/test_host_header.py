"""DNS rebinding: a web page whose name resolves to 127.0.0.1 reads the sidecar as its own origin, but its
requests carry its own name in Host. The sidecar answers only the names it is reached by (its bound address,
localhost when that is loopback, or sidecar.allowed_hosts), on every route, reads included."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from tests.faults._faults import sidecar_with_token

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
READS = ["/v1/engine", "/v1/live", "/metrics", "/readyz", "/", "/openapi.json"]


@pytest.mark.parametrize("allowed", [None, "[sidecar.example, '[fd00::7]', 127.0.0.1]"])
def test_a_host_header_the_sidecar_does_not_answer_to_is_refused(shm_dir, allowed):
    env = {} if allowed is None else {"GATHERWISE_SIDECAR_ALLOWED_HOSTS": allowed}
    proc, url, api = sidecar_with_token(shm_dir, **env)
    try:
        port = urlsplit(url).port
        if allowed is None:
            answered = ["127.0.0.1", f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", f"[::1]:{port}"]
            refused = ["rebind.example", f"rebind.example:{port}", "127.0.0.1.rebind.example", f"[fd00::7]:{port}"]
        else:
            answered = [f"sidecar.example:{port}", "Sidecar.Example", f"[fd00::7]:{port}", f"127.0.0.1:{port}"]
            refused = [f"localhost:{port}", "[::1]", "rebind.example"]  # the list replaces the defaults
        for host in answered:
            assert api.get("/healthz", headers={"Host": host}).status_code == 200, host
        for host in refused:
            for path in READS:
                r = api.get(path, headers={"Host": host})
                assert r.status_code == 400 and "Host" in r.json()["detail"], (host, path, r.status_code)
            put = api.put("/v1/mode", json={"mode": "gather"}, headers={"Host": host})
            assert put.status_code == 400, (host, put.status_code)
        assert proc.stop() == 0, "".join(proc.output)
    finally:
        if proc.popen.poll() is None:
            proc.popen.kill()
            proc.popen.wait(30)
