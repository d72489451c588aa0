"""The secrets of a deployment over several hosts: made once (``crescent serve secrets DIR``),
copied to every host, and read there by ``crescent serve ROLE --secrets DIR``.

The folder has the layout ``crescent secrets compose`` writes (``crescent.secrets_init``): the
cache secret, the catalogue's token, the gateway's API key digests, S3 keys and identities,
Postgres's password, one NATS password per user, NATS's configuration, the slots file and the
certificates in ``tls/``. What differs is who the NATS users are. The scaled roles (gateway,
scheduler, prefill, decode) get one user per slot, a node id each, as in compose; tierd keeps
its role's user, as in Kubernetes, because every host runs one and hosts are not known in
advance; kvindex has its own, and ``tools`` may read heartbeats (for watchers and benchmarks).
The CA's key stays beside the folder (``DIR-ca``), never in it, so copying the folder to the
other hosts does not copy the key that issues certificates.

Services dial one another by address (no service names between hosts), so every certificate
a server presents carries the fixed name ``crescent-internal`` and every process checks that
name (``CRESCENT_TLS_SERVER_NAME``) instead of the address it dialled.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from crescent import secrets_init, up_secrets
from crescent.nats_config import KVINDEX, RELAY, NatsAuthFiles
from crescent.secrets_tls import TlsPaths, compose_specs
from crescent.slots import SlotSettings, pod_nodes, read_slots
from shared.nats_auth import TOOLS
from shared.secrets import read_secret_file

#: The NATS users that stand for a whole role here: every host's tierd shares its role's, and
#: every relay of another engine's KV events the relays' one.
ROLE_USERS = ("tierd", KVINDEX, RELAY, TOOLS)
_PASSWORD_PREFIX, _PASSWORD_SUFFIX = "nats-", "-password"


def ca_dir_for(directory: Path) -> Path:
    """Where the CA of ``directory``'s certificates is kept by default: beside it."""
    return directory.with_name(f"{directory.name}-ca")


def hosts_plan(slots: SlotSettings, directory: Path) -> secrets_init.SecretPlan:
    """The secrets of a deployment over several hosts whose folder lives at ``directory`` on
    each of them (NATS's configuration names its certificate files there)."""
    nodes = pod_nodes(slots, prefix="")
    tls = directory.resolve() / secrets_init.TLS_DIR
    paths = TlsPaths(str(tls / "ca.pem"), str(tls / "nats.pem"), str(tls / "nats.key"))
    certs = (*compose_specs(), secrets_init.KVINDEX_CERT, secrets_init.RELAY_CERT)
    return secrets_init.SecretPlan((*nodes, *ROLE_USERS), nodes, certs, paths)


def write(
    directory: Path, slots: SlotSettings, ca_dir: Path | None, out: Callable[[str], None]
) -> int:
    """``crescent serve secrets``: fills ``directory`` (keeping what is there); says what it
    made and what to copy where, never a value."""
    ca = ca_dir if ca_dir is not None else ca_dir_for(directory)
    try:
        created = secrets_init.ensure_files(directory, hosts_plan(slots, directory), ca)
    except ValueError as exc:
        out(f"crescent serve secrets: error: {exc}")
        return 1
    made = ", ".join(created) if created else "nothing new (every secret was there)"
    out(f"crescent serve secrets: {made} in {directory}; the CA's key is in {ca}")
    out(
        f"crescent serve secrets: copy {directory} to the same path on every host (it holds "
        f"every service's secrets: mode 0700, root or the service user only); keep {ca} here"
    )
    if secrets_init.API_KEY in created:
        key = directory / secrets_init.API_KEY
        tenant = secrets_init.OPERATOR_TENANT
        out(f"crescent serve secrets: the gateway's API key (tenant {tenant!r}) is in {key}")
    return 0


class SecretsFolder:
    """A copy of the deployment's secrets folder on this host. Owns the mapping from its files
    to the variables each role reads; invariant: it only names files (the cache secret, which
    has no ``*_FILE`` setting, is the one value it reads)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory.expanduser().resolve()

    def file(self, name: str) -> Path:
        return self.directory / name

    def nats_auth(self) -> NatsAuthFiles:
        """Every NATS user's password file in the folder."""
        files = {}
        for path in sorted(self.directory.glob(f"{_PASSWORD_PREFIX}*{_PASSWORD_SUFFIX}")):
            user = path.name.removeprefix(_PASSWORD_PREFIX).removesuffix(_PASSWORD_SUFFIX)
            files[user] = path
        return NatsAuthFiles(self.file(secrets_init.NATS_CONFIG), files)

    def slots(self, role: str) -> list[str]:
        """``role``'s node ids as the folder lists them; ``ValueError`` naming the folder."""
        return read_slots(self.directory, role)

    def cache_secret(self) -> str:
        return read_secret_file(self.file(secrets_init.CACHE_SECRET), "the folder's cache secret")

    def tls(self, role: str) -> dict[str, str]:
        """TLS on with ``role``'s certificate, the fixed server name checked (empty: the
        folder has no certificate for it)."""
        tls = self.file(secrets_init.TLS_DIR)
        if not (tls / f"{role}.pem").is_file():
            return {}
        paths = TlsPaths(str(tls / "ca.pem"), str(tls / f"{role}.pem"), str(tls / f"{role}.key"))
        return paths.env(server_name=True)

    def role_files(self) -> dict[str, dict[str, str]]:
        """What each role reads from the folder beyond its NATS user and TLS files."""
        s3 = {
            "CRESCENT_S3_ACCESS_KEY_FILE": str(self.file(secrets_init.S3_ACCESS_KEY)),
            "CRESCENT_S3_SECRET_KEY_FILE": str(self.file(secrets_init.S3_SECRET_KEY)),
            "CRESCENT_S3_CA_BUNDLE": str(self.file(secrets_init.TLS_DIR) / "ca.pem"),
        }
        return {
            "gateway": {"CRESCENT_API_KEYS_FILE": str(self.file(secrets_init.API_KEYS))},
            "tierd": s3,
        }

    def db_url(self, db_host: str) -> str:
        """The catalogue database's URL from the folder, its server at ``db_host``
        (``host:port``) instead of the compose service's name."""
        url = urlsplit(read_secret_file(self.file(secrets_init.DB_URL), "the folder's db-url"))
        credentials = url.netloc.rpartition("@")[0]
        return urlunsplit(url._replace(netloc=f"{credentials}@{db_host}"))


def roles_of(
    folder: SecretsFolder, env: dict[str, str], hashing: Collection[str]
) -> dict[str, dict[str, str]]:
    """What each role and each NATS user adds to ``env`` (as ``crescent up`` builds it for its
    own NATS): the folder's NATS identities (dropping credentials ``env`` inherited), the
    catalogue's token for its callers and cachemeta, every role's certificate, the gateway's
    API keys, tierd's S3 keys, and the cache secret for the roles in ``hashing``. What ``env``
    sets already (a token, a cache secret) is kept."""
    roles = up_secrets.nats_identities(env, folder.nats_auth())
    if not env.get("CRESCENT_CACHEMETA_TOKEN") and not env.get("CRESCENT_CACHEMETA_TOKEN_FILE"):
        token = {"CRESCENT_CACHEMETA_TOKEN_FILE": str(folder.file(secrets_init.CACHEMETA_TOKEN))}
        up_secrets.merge(roles, token, *up_secrets.TOKEN_HOLDERS, "cachemeta")
    for role in (*up_secrets.TOKEN_HOLDERS, "gateway", "cachemeta"):
        up_secrets.merge(roles, folder.tls(role), role)
    for role, files in folder.role_files().items():
        up_secrets.merge(roles, files, role)
    if not env.get("CRESCENT_CACHE_SECRET"):
        up_secrets.merge(roles, {"CRESCENT_CACHE_SECRET": folder.cache_secret()}, *hashing)
    return roles


def slot_of(folder: SecretsFolder, role: str, given: str | None) -> str:
    """The node id ``role`` runs as: ``given`` if the folder has a slot of that name, or the
    only slot when there is one; ``ValueError`` saying why not (no flag picks for the operator
    between slots: two hosts picking the same one would be one node twice)."""
    slots = folder.slots(role)
    if given is None and len(slots) == 1:
        return slots[0]
    if given in slots:
        return given
    listed = ", ".join(slots)
    if given is None:
        raise ValueError(f"--node-id is required: {folder.directory} has {role} slots {listed}")
    raise ValueError(f"--node-id {given} is not a {role} slot of {folder.directory} ({listed})")


def require_identity(
    folder: SecretsFolder, roles: dict[str, dict[str, str]], role: str, node_id: str
) -> None:
    """Gives the instance ``node_id`` of ``role`` its NATS identity: its own user or its
    role's, as the folder has them. With neither, the password file its own user would have
    is named, so the NATS settings refuse it by name instead of connecting without one."""
    user = "CRESCENT_NATS_USER"
    if user in roles.get(node_id, {}) or user in roles.get(role, {}):
        return
    missing = folder.file(secrets_init.nats_password_key(node_id))
    roles[node_id] = {user: node_id, "CRESCENT_NATS_PASSWORD_FILE": str(missing)}
