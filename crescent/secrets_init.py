"""The secrets of a container deployment, generated where it first starts: ``crescent secrets
compose DIR`` fills the folder docker-compose.yml's services read theirs from, and
``crescent secrets k8s`` prints the Kubernetes Secret the manifests reference.

Every secret is 256 random bits unless a file already holds it: a second run keeps what the
first one made (rotating one is deleting its file, see docs/operations.md). The files derived
from them (the NATS configuration, the S3 identities, the database URL, the API key digests)
are rewritten from the secrets on every run, so they always agree.

The certificates of the internal plane (``crescent.secrets_tls``) are kept the same way, and
made again when missing, near their end, or for other names; the NATS configuration gets the
``tls`` block for the files where the NATS container mounts them.

NATS users are a parameter: compose and Kubernetes get one per slot (``crescent.slots``), so
each replica connects as a node of its own; ``--nats-user`` names users instead (one per role,
as earlier versions ran).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from crescent.certs import Authority
from crescent.nats_config import KVINDEX, RELAY, render_config
from crescent.secret_files import (
    PRIVATE_FILE,
    create_private,
    new_secret,
    private_dir,
    write_private,
)
from crescent.secrets_tls import (
    CertSpec,
    TlsPaths,
    ca_in,
    compose_paths,
    compose_specs,
    ensure_certs,
    k8s_paths,
    k8s_specs,
    k8s_tls_data,
    nats_tls_block,
)
from crescent.slots import SLOTS_FILE, SlotSettings, compose_nodes, pod_nodes, slot_listing
from shared import subjects
from shared.secrets import is_placeholder, read_secret_file

#: The tenant of the API key generated for the operator.
OPERATOR_TENANT = "default"
POSTGRES_USER = "crescent"
POSTGRES_DB = "crescent"
#: Where the services meet the servers in compose and in the Kubernetes manifests.
POSTGRES_HOST = "postgres:5432"
S3_IDENTITY = "crescent"
S3_ACTIONS = ("Admin", "Read", "Write", "List", "Tagging")
NATS_LISTEN = "0.0.0.0:4222"
#: Monitoring on the container's loopback only, for its health check.
NATS_HTTP = "127.0.0.1:8222"

CACHE_SECRET = "cache-secret"
CACHEMETA_TOKEN = "cachemeta-token"
POSTGRES_PASSWORD = "postgres-password"
S3_ACCESS_KEY = "s3-access-key"
S3_SECRET_KEY = "s3-secret-key"
#: The operator's API key in plain text: compose only; Kubernetes keeps just its digest.
API_KEY = "api-key"
DB_URL = "db-url"
API_KEYS = "api-keys"
S3_IDENTITIES = "s3-identities"
NATS_CONFIG = "nats-config"
#: Kubernetes: the Secret only NATS mounts (its configuration, passwords included), and the
#: per-role Secrets of the services' passwords, keyed by NATS user (a pod's name).
NATS_SECRET = "crescent-nats"
NATS_CONFIG_KEY = "nats.conf"
MAIN_SECRET = "crescent-secrets"
#: The compose folder of the certificates, inside the secrets folder.
TLS_DIR = "tls"


def nats_password_key(user: str) -> str:
    """The name of ``user``'s NATS password: a file in compose, a key of the Secret."""
    return f"nats-{user}-password"


def _access_key() -> str:
    # S3 access keys are conventionally upper-case letters and digits; it is not the secret.
    return "CR" + secrets.token_hex(9).upper()


@dataclass(frozen=True, slots=True)
class SecretPlan:
    """Which secrets a deployment needs and how each is made. Invariant: every name is one
    file (compose) or one key (Kubernetes); the NATS users are exactly ``nats_users``, each
    a node id of ``nodes`` (node id -> role) or a role's name. ``certs``: the certificates
    of the internal plane; ``nats_tls``: where the NATS server reads its own (None: NATS
    runs without TLS, for a plan without certificates)."""

    nats_users: tuple[str, ...]
    nodes: Mapping[str, str] = field(default_factory=dict)
    certs: tuple[CertSpec, ...] = ()
    nats_tls: TlsPaths | None = None

    def role_of(self, user: str) -> str:
        """The role ``user`` serves: its node's, or its own name for a role's user."""
        return self.nodes.get(user, user)

    def makers(self) -> dict[str, Callable[[], str]]:
        """Each random secret's name -> how a new one is made."""
        made: dict[str, Callable[[], str]] = {
            CACHE_SECRET: new_secret,
            CACHEMETA_TOKEN: new_secret,
            POSTGRES_PASSWORD: new_secret,
            S3_ACCESS_KEY: _access_key,
            S3_SECRET_KEY: new_secret,
            API_KEY: new_secret,
        }
        made.update({nats_password_key(user): new_secret for user in self.nats_users})
        return made

    def derived(self, values: Mapping[str, str]) -> dict[str, str]:
        """What the servers and services read, made from the secrets in ``values``."""
        from services.gateway.auth import key_line

        password = values[POSTGRES_PASSWORD]
        identities = {
            "identities": [
                {
                    "name": S3_IDENTITY,
                    "credentials": [
                        {"accessKey": values[S3_ACCESS_KEY], "secretKey": values[S3_SECRET_KEY]}
                    ],
                    "actions": list(S3_ACTIONS),
                }
            ]
        }
        users = {user: values[nats_password_key(user)] for user in self.nats_users}
        return {
            DB_URL: f"postgresql+asyncpg://{POSTGRES_USER}:{password}@{POSTGRES_HOST}/{POSTGRES_DB}",
            API_KEYS: key_line(values[API_KEY], OPERATOR_TENANT) + "\n",
            S3_IDENTITIES: json.dumps(identities, indent=2) + "\n",
            NATS_CONFIG: self._nats_config(users),
            SLOTS_FILE: slot_listing(self.nodes),
        }

    def _nats_config(self, users: Mapping[str, str]) -> str:
        text = render_config(users, nodes=self.nodes, listen=NATS_LISTEN, http=NATS_HTTP)
        if self.nats_tls is None:
            return text
        # The server's files are where its container mounts them, so the block is rendered
        # from those paths rather than from this process's own TLS settings.
        block = json.dumps(nats_tls_block(self.nats_tls)["tls"])
        lines = [line for line in text.splitlines() if not line.startswith("tls: ")]
        at = next(i for i, line in enumerate(lines) if line.startswith("system_account: "))
        return "\n".join([*lines[:at], f"tls: {block}", *lines[at:]]) + "\n"


#: kvindex's client certificate (NATS asks every client for one); it serves no TLS itself.
KVINDEX_CERT = CertSpec(KVINDEX, (KVINDEX,))
#: The client certificate every relay of another engine's KV events shares with its user.
RELAY_CERT = CertSpec(RELAY, (RELAY,))


def role_plan() -> SecretPlan:
    """One NATS user per role (every replica of a role shares it), kvindex's and the relays'."""
    return SecretPlan((*subjects.ROLES, KVINDEX, RELAY))


def compose_plan(slots: SlotSettings, host_id: str) -> SecretPlan:
    """A NATS user per compose slot, the host's tierd, and the stack's one kvindex (a slot of
    its own, which its container claims like the others); and the relays' shared user, which
    is no slot (one relay runs beside each engine, however many)."""
    nodes = compose_nodes(slots, host_id) | {KVINDEX: KVINDEX}
    certs = (*compose_specs(), KVINDEX_CERT, RELAY_CERT)
    return SecretPlan((*nodes, RELAY), nodes, certs, compose_paths("nats"))


def k8s_plan(slots: SlotSettings, namespace: str = "crescent") -> SecretPlan:
    """A NATS user per StatefulSet pod; tierd, a DaemonSet whose pods are named after no
    ordinal, keeps its role's user, and so does kvindex, a Deployment of one pod, and the
    relays of other engines' KV events."""
    nodes = pod_nodes(slots)
    certs = (*k8s_specs(namespace), KVINDEX_CERT, RELAY_CERT)
    return SecretPlan((*nodes, "tierd", KVINDEX, RELAY), nodes, certs, k8s_paths())


def tls_secret_name(name: str) -> str:
    """The TLS Secret of certificate ``name``, which only that service's pods mount."""
    return f"crescent-tls-{name}"


def role_secret_name(role: str) -> str:
    """The Secret of ``role``'s NATS passwords, which only that role's pods mount."""
    return f"{NATS_SECRET}-{role}"


def _keep_or_create(path: Path, make: Callable[[], str]) -> tuple[str, bool]:
    """The secret in ``path``, created if absent; True when this call created it. A file
    that holds a known placeholder is refused rather than kept."""
    created = not path.exists() and create_private(path, make() + "\n")
    value = read_secret_file(path, f"the secret file {path.name}")
    if is_placeholder(value):
        raise ValueError(f"{path.name} holds a known placeholder; delete it to regenerate")
    path.chmod(PRIVATE_FILE)
    return value, created


def ensure_files(directory: Path, plan: SecretPlan, ca_dir: Path | None = None) -> list[str]:
    """Every secret of ``plan`` in ``directory`` (0700, files 0600), keeping those that exist;
    the derived files rewritten from them; the certificates in its ``tls`` folder, from the CA
    kept in ``ca_dir`` (default: ``tls-ca`` beside them). Returns the names created by this
    call."""
    private_dir(directory)
    values: dict[str, str] = {}
    created = []
    for name, make in plan.makers().items():
        values[name], new = _keep_or_create(directory / name, make)
        if new:
            created.append(name)
    for name, text in plan.derived(values).items():
        write_private(directory / name, text)
    if plan.certs:
        ca_folder = ca_dir if ca_dir is not None else directory / "tls-ca"
        created += ensure_certs(directory / TLS_DIR, ca_folder, plan.certs)
    return created


def _secret(
    name: str, namespace: str, data: Mapping[str, str], kind: str = "Opaque"
) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "crescent"},
        },
        "type": kind,
        "stringData": dict(sorted(data.items())),
    }


def k8s_secrets(
    plan: SecretPlan,
    *,
    namespace: str = "crescent",
    nats_only: bool = False,
    tls_only: bool = False,
    ca: Authority | None = None,
) -> tuple[list[dict[str, object]], str]:
    """Fresh Secrets for deploy/k8s and the operator's API key, which they hold only as a
    digest (returned so it can be shown once). NATS's configuration is a Secret of its own,
    each role's NATS passwords another, and each certificate (from ``ca``, default a new CA
    whose key is not kept) one more, so a pod mounts its role's and no more. ``nats_only``,
    ``tls_only``: those Secrets alone (the key is then empty)."""
    if tls_only:
        return _tls_secrets(plan, namespace, ca), ""
    values = {key: make() for key, make in plan.makers().items()}
    derived = plan.derived(values)
    passwords: dict[str, dict[str, str]] = {}
    for user in plan.nats_users:
        key = nats_password_key(user)
        passwords.setdefault(plan.role_of(user), {})[user] = values.pop(key)
    objects = [_secret(NATS_SECRET, namespace, {NATS_CONFIG_KEY: derived.pop(NATS_CONFIG)})]
    objects += [
        _secret(role_secret_name(role), namespace, users) for role, users in passwords.items()
    ]
    if nats_only:
        return objects, ""
    del derived[SLOTS_FILE]  # a pod's name is its slot
    api_key = values.pop(API_KEY)
    tls = _tls_secrets(plan, namespace, ca)
    return [_secret(MAIN_SECRET, namespace, values | derived), *objects, *tls], api_key


def _tls_secrets(plan: SecretPlan, namespace: str, ca: Authority | None) -> list[dict[str, object]]:
    issued = k8s_tls_data(ca or Authority.create(), plan.certs)
    return [
        _secret(tls_secret_name(name), namespace, data, "kubernetes.io/tls")
        for name, data in issued.items()
    ]


def k8s_secret(
    plan: SecretPlan, *, name: str = MAIN_SECRET, namespace: str = "crescent"
) -> tuple[dict[str, object], str]:
    """The Secret of everything but NATS's credentials, and the operator's API key."""
    objects, api_key = k8s_secrets(plan, namespace=namespace)
    main = objects[0]
    metadata = main["metadata"]
    assert isinstance(metadata, dict)
    metadata["name"] = name
    return main, api_key


def compose_main(
    directory: Path, plan: SecretPlan, out: Callable[[str], None], ca_dir: Path | None = None
) -> int:
    """``crescent secrets compose``: fills ``directory``; says what it made, never a value."""
    try:
        created = ensure_files(directory, plan, ca_dir)
    except ValueError as exc:
        out(f"crescent secrets: error: {exc}")
        return 1
    if not created:
        out(f"crescent secrets: every secret already exists in {directory}; none changed")
        return 0
    out(f"crescent secrets: generated {', '.join(created)} in {directory}")
    if API_KEY in created:
        out(
            f"crescent secrets: the gateway's API key (tenant {OPERATOR_TENANT!r}) is in "
            f"{directory / API_KEY}; read it with "
            f"`docker compose run --rm --no-deps secrets-init cat {directory / API_KEY}`"
        )
    return 0


def k8s_main(
    namespace: str,
    plan: SecretPlan,
    out: Callable[[str], None],
    *,
    nats_only: bool = False,
    tls_only: bool = False,
    ca_dir: Path | None = None,
) -> tuple[int, str]:
    """``crescent secrets k8s``: the Secrets as one JSON List (for ``kubectl create -f -``),
    and the notice with the API key for the operator's terminal, never for the pipe. The CA
    is kept in ``ca_dir`` when given (made there on first use), so later certificates come
    from the same CA; without it, each run makes a new CA and forgets its key."""
    ca = ca_in(ca_dir)[0] if ca_dir is not None else None
    objects, api_key = k8s_secrets(
        plan, namespace=namespace, nats_only=nats_only, tls_only=tls_only, ca=ca
    )
    out(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2))
    if nats_only:
        return 0, "crescent secrets: new NATS passwords; restart NATS, then every Crescent pod"
    if tls_only:
        return 0, "crescent secrets: new certificates; restart NATS and S3, then every Crescent pod"
    notice = (
        f"crescent secrets: the gateway's API key (tenant {OPERATOR_TENANT!r}), shown only "
        f"now; the Secret holds its digest:\n{api_key}"
    )
    return 0, notice
