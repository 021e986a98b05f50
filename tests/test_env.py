"""The environment variables' names: each spelled once, and the readers use them."""

from specserve import paths
from specserve.env import CLIENT_URL, DEPLOYMENT_VARIABLES, EnvVar


def test_names_are_distinct_and_deployment_ones_are_known():
    names = [*EnvVar, CLIENT_URL]
    assert len(set(names)) == len(names)
    assert set(DEPLOYMENT_VARIABLES) <= set(EnvVar)


def test_the_cache_follows_its_variable(monkeypatch, tmp_path):
    monkeypatch.setenv(EnvVar.CACHE, str(tmp_path))
    assert paths.default_cache_dir() == tmp_path
    monkeypatch.delenv(EnvVar.CACHE)
    assert paths.default_cache_dir().name == "specserve"
