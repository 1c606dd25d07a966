"""AWS for tests: one moto server per session, over real HTTP.

Fixtures (a pytest plugin listed in ``tests/conftest.py``):

``moto_server`` (session)
    Starts ``moto.server.ThreadedMotoServer`` on 127.0.0.1 and a free port and
    returns its URL (``http://127.0.0.1:PORT``). For the session it sets
    ``AWS_ENDPOINT_URL`` to that URL, fake credentials
    (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` = ``testing``) and
    ``AWS_DEFAULT_REGION=us-east-1``; it points the AWS config and
    credentials files at ``/dev/null`` and unsets ``AWS_PROFILE`` and session
    tokens, so no test can reach a real account. Any boto3 client created
    without an explicit endpoint talks to moto. ``MOTO_EC2_LOAD_DEFAULT_AMIS``
    is ``false`` (cheap resets; ``run_instances`` accepts any AMI id). For the
    session moto's EC2 has what it lacks of EC2's API filled in
    (``orphan_cleanup.demo.moto_gaps``: placement groups, key pairs by id), as the
    demo's moto has.

``moto_reset`` (function)
    Depends on ``moto_server``, wipes moto's state before the test
    (``POST {url}/moto-api/reset``, a few milliseconds) and returns the URL.
    Use it in every test that creates AWS resources.
"""

from __future__ import annotations

import logging
import os
import urllib.request
from collections.abc import Iterator

import boto3
import pytest
from moto.server import ThreadedMotoServer

from orphan_cleanup.demo.moto_gaps import filled

FAKE_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    # moto (in this process) would load ~thousands of public AMIs into every
    # region after each reset; any AMI id is accepted without them.
    "MOTO_EC2_LOAD_DEFAULT_AMIS": "false",
}
UNSET_ENV = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS",
)


def reset_moto(url: str) -> None:
    """Forget every resource of every service and region in the moto server."""
    request = urllib.request.Request(f"{url}/moto-api/reset", method="POST", data=b"")
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """A moto server for the whole session; returns its URL (see the module docstring)."""
    # One line per HTTP request on stderr is noise in test output.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    env = pytest.MonkeyPatch()
    env.setenv("AWS_ENDPOINT_URL", url)
    for key, value in FAKE_ENV.items():
        env.setenv(key, value)
    for key in UNSET_ENV:
        env.delenv(key, raising=False)
    boto3.DEFAULT_SESSION = None  # a default session made earlier may hold other credentials
    try:
        with filled():
            yield url
    finally:
        env.undo()
        boto3.DEFAULT_SESSION = None
        server.stop()


@pytest.fixture
def moto_reset(moto_server: str) -> str:
    """Empty moto state for this test; returns the server URL."""
    reset_moto(moto_server)
    return moto_server
