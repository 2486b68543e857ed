"""TLS on the trajectory transport: a self-signed certificate for 127.0.0.1, made here."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import grpc
import pytest
from pydantic import ValidationError

from horizonrl.actors.transport import TrajectorySender
from horizonrl.learner.config import IngestConfig
from horizonrl.learner.ingest import TrajectoryIngest
from horizonrl.protos.trajectory import Trajectory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _traj(i: int) -> Trajectory:
    return Trajectory(
        trajectory_id=f"tls-{i}", group_id="g", task_id="task", env_name="babyai",
        policy_version=0, horizon=2, prompt_ids=(1, 2), response_ids=(3, 4),
        response_mask=(1, 0), response_logprobs=(-0.5, 0.0), rewards=(1.0,), reward=1.0,
        num_turns=1, terminated=True, truncated=False)


def self_signed(out: Path) -> tuple[Path, Path]:
    """(cert.pem, key.pem) in `out`: self-signed, valid for IP 127.0.0.1, its own CA."""
    from cryptography import x509  # a dev dependency (pyproject.toml)
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "horizonrl-test-ingest")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    (out / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (out / "key.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return out / "cert.pem", out / "key.pem"


@pytest.fixture(scope="module")
def cert_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed(tmp_path_factory.mktemp("tls"))


def test_tls_ingest_from_config_serves_a_sender_that_trusts_its_cert(
    cert_files: tuple[Path, Path],
) -> None:
    cert, key = cert_files
    cfg = IngestConfig(tls_cert_path=str(cert), tls_key_path=str(key), tls_ca_path=str(cert))
    with TrajectoryIngest.from_config(cfg) as ingest:
        with TrajectorySender(ingest.address, deadline_s=10.0,
                              tls_ca_path=cfg.tls_ca_path) as sender:
            assert sender.send([_traj(0), _traj(1)]).received == 2

        # A plaintext client cannot talk to it: the handshake never completes.
        with TrajectorySender(ingest.address, deadline_s=2.0, retries=0) as plain:
            with pytest.raises(grpc.RpcError) as err:
                plain.send([_traj(2)])
        assert err.value.code() in (grpc.StatusCode.UNAVAILABLE,
                                    grpc.StatusCode.DEADLINE_EXCEEDED)
        assert [t.trajectory_id for t in ingest.drain()] == ["tls-0", "tls-1"]


def test_sender_that_does_not_trust_the_cert_is_refused(
    cert_files: tuple[Path, Path], tmp_path: Path
) -> None:
    cert, key = cert_files
    stranger, _ = self_signed(tmp_path)  # same name and IP, another key: not our ingest
    with TrajectoryIngest(port=0, tls_cert_path=str(cert), tls_key_path=str(key)) as ingest:
        with TrajectorySender(ingest.address, deadline_s=2.0, retries=0,
                              tls_ca_path=str(stranger)) as wrong:
            with pytest.raises(grpc.RpcError):
                wrong.send([_traj(3)])
        assert ingest.stats()["received"] == 0


def test_cert_without_key_is_a_config_error() -> None:
    with pytest.raises(ValidationError, match="together"):
        IngestConfig(tls_cert_path="/etc/ingest/cert.pem")
    with pytest.raises(ValueError, match="together"):
        TrajectoryIngest(tls_key_path="/etc/ingest/key.pem")
