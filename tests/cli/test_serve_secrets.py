"""`crescent serve secrets DIR`: the secrets of a deployment over several hosts, made once and
copied to each: a NATS user per slot of the scaled roles, one tierd user for every host, the
certificates every host checks by one name, and the CA's key left out of the folder."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from cryptography import x509

from crescent.secrets_tls import SERVER_NAME
from crescent.serve_secrets import SecretsFolder, ca_dir_for

SLOTS = {
    "CRESCENT_GATEWAY_SLOTS": "1",
    "CRESCENT_SCHEDULER_SLOTS": "1",
    "CRESCENT_PREFILL_SLOTS": "2",
    "CRESCENT_DECODE_SLOTS": "3",
}


def make(directory: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "crescent", "serve", "secrets", str(directory)]
    return subprocess.run(argv, env=os.environ | SLOTS, capture_output=True, text=True)


def names(cert: Path) -> set[str]:
    parsed = x509.load_pem_x509_certificate(cert.read_bytes())
    sans = parsed.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return set(sans.get_values_for_type(x509.DNSName))


def test_the_folder_holds_every_secret_privately_and_not_the_key_of_the_ca(tmp_path: Path) -> None:
    folder = tmp_path / "secrets"
    done = make(folder)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert files and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)
    assert not [p for p in files if p.name == "ca.key"]
    assert (ca_dir_for(folder) / "ca.key").is_file()
    assert str(ca_dir_for(folder)) in done.stdout and "api-key" in done.stdout


def test_a_second_run_keeps_every_secret(tmp_path: Path) -> None:
    folder = tmp_path / "secrets"
    assert make(folder).returncode == 0
    before = {p.name: p.read_bytes() for p in folder.glob("*") if p.is_file()}
    again = make(folder)
    assert again.returncode == 0 and "nothing new" in again.stdout
    after = {p.name: p.read_bytes() for p in folder.glob("*") if p.is_file()}
    assert after == before


def test_each_slot_is_a_nats_user_and_every_hosts_tierd_shares_one(tmp_path: Path) -> None:
    folder = tmp_path / "secrets"
    assert make(folder).returncode == 0
    users = set(SecretsFolder(folder).nats_auth().password_files)
    slots = {"gateway-0", "scheduler-0", "prefill-0", "prefill-1"}
    shared = {"tierd", "kvindex", "kvindex-relay", "tools"}
    assert users == slots | {"decode-0", "decode-1", "decode-2"} | shared
    assert (folder / "tls" / "kvindex-relay.pem").is_file()  # a relay's client certificate
    assert SecretsFolder(folder).slots("decode") == ["decode-0", "decode-1", "decode-2"]
    config = (folder / "nats-config").read_text()
    for user in users:
        password = (folder / f"nats-{user}-password").read_text().strip()
        assert f'user: "{user}"' in config and password in config
    # NATS reads its certificate from the folder where it is on every host.
    assert str(folder.resolve() / "tls" / "nats.pem") in config


def test_every_server_certificate_carries_the_name_every_host_checks(tmp_path: Path) -> None:
    folder = tmp_path / "secrets"
    assert make(folder).returncode == 0
    for server in ("nats", "cachemeta", "prefill", "decode", "tierd"):
        assert SERVER_NAME in names(folder / "tls" / f"{server}.pem"), server
    tls = SecretsFolder(folder).tls("decode")
    assert tls["CRESCENT_TLS_SERVER_NAME"] == SERVER_NAME
    assert tls["CRESCENT_TLS_CERT_FILE"] == str(folder.resolve() / "tls" / "decode.pem")
