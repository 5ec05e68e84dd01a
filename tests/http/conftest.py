"""Shared fixtures of the HTTP tests: dolphind on each test model (one per
session), and the golden files. The harness itself (launcher, SSE parser,
error-shape check) is dolphin_server.py."""
import pytest

from dolphin_server import API_KEY, Dolphind, golden


@pytest.fixture(scope="session")
def server():
    srv = Dolphind("stories260K")
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def tiny_server():
    srv = Dolphind("tiny-llama2")
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def auth_server():
    srv = Dolphind("stories260K", ["--api-key", API_KEY])
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def stories_golden():
    return golden("stories260K")


@pytest.fixture(scope="session")
def tiny_golden():
    return golden("tiny-llama2")
