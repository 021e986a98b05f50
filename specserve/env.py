"""The environment variables specserve reads, each name spelled here only: the servers' (`EnvVar`,
read by `platform.settings.Environment`; `paths` reads the cache's), and the clients' server address."""

from __future__ import annotations

from enum import StrEnum


class EnvVar(StrEnum):
    """The variables specserve's servers read (`platform.settings.Environment`)."""

    ADMIN_TOKEN = "SPECSERVE_ADMIN_TOKEN"
    TENANT_KEYS_FILE = "SPECSERVE_TENANT_KEYS_FILE"
    REDIS_URL = "REDIS_URL"
    POOL_REDIS_URL = "SPECSERVE_POOL_REDIS_URL"
    REDIS_EMBEDDED = "SPECSERVE_REDIS_EMBEDDED"
    CACHE = "SPECSERVE_CACHE"
    POLICY_FILE = "SPECSERVE_POLICY_FILE"
    ADAPTER_ROOT = "SPECSERVE_ADAPTER_ROOT"
    FAULT_INJECTION = "SPECSERVE_FAULT_INJECTION"


# what a deployment sets for its replicas, passed on by `specserve up` as it finds them
DEPLOYMENT_VARIABLES = (
    EnvVar.POLICY_FILE,
    EnvVar.ADAPTER_ROOT,
    EnvVar.TENANT_KEYS_FILE,
    EnvVar.POOL_REDIS_URL,
    EnvVar.REDIS_URL,
)

# the admin client's and the tools' default server address (a client's variable, no server setting)
CLIENT_URL = "SPECSERVE_URL"
