"""KEDA's pieces for :mod:`nsqworker.testing.keda`: where the binaries are, certificates
for API aggregation and for KEDA, and the manifests that route external metrics.

Certificates are ECDSA P-256, valid two days, written with ``cryptography``.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nsqworker.testing.processes import find_binary

__all__ = [
    "KEDA_VERSION",
    "KedaBinaries",
    "aggregation_apiserver_args",
    "apiservice_manifests",
    "find_keda",
    "write_keda_certificates",
]

KEDA_VERSION = "v2.21.0"
"""The KEDA release scripts/install-tools builds (and tests/crds holds the CRD of)."""
KEDA_NAMESPACE = "keda"
SERVICE_ACCOUNT = "keda-operator"
METRICS_SERVICE = "keda-operator-metrics-apiserver"
APISERVICE = "v1beta1.external.metrics.k8s.io"
KEDA_INSTALL_HINT = (
    "keda-operator and keda-adapter (and KEDA's source in .tools/keda-src) come from"
    " `scripts/install-tools keda` (needs Go 1.26+)"
)
# The processes' ports on the node; KEDA's defaults collide (8080, 8081 for both).
GRPC_PORT = 9666
"""The operator's metrics service (gRPC, mutual TLS), on 127.0.0.1."""
OPERATOR_METRICS_PORT = 18080
OPERATOR_HEALTH_PORT = 18081
ADAPTER_PORT = 7443
"""The adapter's HTTPS port, on every address: the aggregator dials NODE_IP:7443."""
ADAPTER_METRICS_PORT = 18082
CERT_DAYS = 2


@dataclass(frozen=True)
class KedaBinaries:
    """The two KEDA programs and KEDA's ``config`` directory (CRDs, RBAC manifests)."""

    operator: str
    adapter: str
    config: Path


def find_keda(bin_dir: str | Path | None = None) -> KedaBinaries:
    """``keda-operator``, ``keda-adapter`` and ``keda-src/config`` next to their ``bin``.

    Raises:
        FileNotFoundError: one is missing; the message says how to get them.
    """
    try:
        operator = find_binary("keda-operator", bin_dir)
        adapter = find_binary("keda-adapter", bin_dir)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"{str(exc).split('; ')[0]}; {KEDA_INSTALL_HINT}") from None
    config = Path(operator).resolve().parent.parent / "keda-src" / "config"
    if not (config / "crd" / "kustomization.yaml").is_file():
        raise FileNotFoundError(f"KEDA's source is not at {config.parent}; {KEDA_INSTALL_HINT}")
    return KedaBinaries(operator, adapter, config)


# ---------------------------------------------------------------------------- certificates


def _key_pem(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def _certificate(
    subject: str,
    key: Any,
    issuer: tuple[Any, Any] | None,
    *,
    usages: Sequence[str] = (),
    dns: Sequence[str] = (),
    ips: Sequence[str] = (),
    organization: str | None = None,
) -> Any:
    """A certificate for ``key``: a CA when ``issuer`` is None, else signed by it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    names = [x509.NameAttribute(NameOID.COMMON_NAME, subject)]
    if organization:
        names.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    name = x509.Name(names)
    now = datetime.datetime.now(datetime.UTC)
    ca_cert, ca_key = issuer if issuer is not None else (None, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(ca_cert.subject if ca_cert is not None else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    is_ca = issuer is None
    builder = builder.add_extension(
        x509.KeyUsage(
            digital_signature=not is_ca,
            content_commitment=False,
            key_encipherment=not is_ca,
            data_encipherment=False,
            key_agreement=False,
            key_cert_sign=is_ca,
            crl_sign=is_ca,
            encipher_only=False,
            decipher_only=False,
        ),
        critical=True,
    )
    oids = {"server": ExtendedKeyUsageOID.SERVER_AUTH, "client": ExtendedKeyUsageOID.CLIENT_AUTH}
    if usages:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([oids[u] for u in usages]), critical=False
        )
    alt: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    alt += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    if alt:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def _write_pair(directory: Path, stem: str, cert: Any, key: Any) -> None:
    from cryptography.hazmat.primitives import serialization

    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{stem}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / f"{stem}.key").write_bytes(_key_pem(key))
    (directory / f"{stem}.key").chmod(0o600)


def _new_key() -> Any:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def aggregation_apiserver_args(cert_dir: str | Path) -> list[str]:
    """Write a front-proxy CA and client certificate; return kube-apiserver's flags for them.

    The flags turn on API aggregation as kubeadm does (``--requestheader-*``,
    ``--proxy-client-*``) plus ``--enable-aggregator-routing=true`` (no kube-proxy: the
    aggregator dials the APIService's endpoint, not its Service's ClusterIP).
    """
    directory = Path(cert_dir)
    ca_key, key = _new_key(), _new_key()
    ca = _certificate("nsqworker-test-front-proxy-ca", ca_key, None)
    client = _certificate("front-proxy-client", key, (ca, ca_key), usages=["client"])
    _write_pair(directory, "front-proxy-ca", ca, ca_key)
    _write_pair(directory, "front-proxy-client", client, key)
    return [
        f"--requestheader-client-ca-file={directory / 'front-proxy-ca.crt'}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={directory / 'front-proxy-client.crt'}",
        f"--proxy-client-key-file={directory / 'front-proxy-client.key'}",
        "--enable-aggregator-routing=true",
    ]


def write_keda_certificates(cert_dir: str | Path, node_ip: str) -> Path:
    """KEDA's ``ca.crt``/``ca.key`` and ``tls.crt``/``tls.key`` in ``cert_dir``.

    ``tls.crt`` is for both ends of the operator-adapter gRPC link and for the adapter's
    HTTPS (serverAuth and clientAuth), named as KEDA's services are, plus localhost,
    127.0.0.1 and ``node_ip``. Returns ``cert_dir``.
    """
    directory = Path(cert_dir)
    ca_key, key = _new_key(), _new_key()
    ca = _certificate("KEDA", ca_key, None)
    dns = ["localhost"]
    for service in ("keda-operator", METRICS_SERVICE, "keda-admission-webhooks"):
        dns += [service, f"{service}.{KEDA_NAMESPACE}", f"{service}.{KEDA_NAMESPACE}.svc"]
        dns.append(f"{service}.{KEDA_NAMESPACE}.svc.cluster.local")
    tls = _certificate(
        f"keda-operator.{KEDA_NAMESPACE}.svc",
        key,
        (ca, ca_key),
        usages=["server", "client"],
        dns=dns,
        ips=["127.0.0.1", node_ip],
        organization="KEDAORG",
    )
    _write_pair(directory, "ca", ca, ca_key)
    _write_pair(directory, "tls", tls, key)
    return directory


def apiservice_manifests(
    ca_pem: bytes, node_ip: str, port: int = ADAPTER_PORT
) -> list[dict[str, Any]]:
    """The Service, EndpointSlice and APIService that route external metrics to the adapter.

    The Service has no selector (no pod backs it): its one EndpointSlice names the
    adapter process at ``node_ip:port``, under the Service's port name.
    """
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": METRICS_SERVICE, "namespace": KEDA_NAMESPACE},
            "spec": {
                "ports": [{"name": "https", "port": 443, "targetPort": port, "protocol": "TCP"}]
            },
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": f"{METRICS_SERVICE}-node",
                "namespace": KEDA_NAMESPACE,
                "labels": {
                    "kubernetes.io/service-name": METRICS_SERVICE,
                    "endpointslice.kubernetes.io/managed-by": "nsqworker-testing",
                },
            },
            "addressType": "IPv4",
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [node_ip], "conditions": {"ready": True}}],
        },
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": APISERVICE},
            "spec": {
                "service": {"name": METRICS_SERVICE, "namespace": KEDA_NAMESPACE, "port": 443},
                "group": "external.metrics.k8s.io",
                "version": "v1beta1",
                "caBundle": base64.b64encode(ca_pem).decode(),
                "groupPriorityMinimum": 100,
                "versionPriority": 100,
            },
        },
    ]


# ---------------------------------------------------------------------------- the runner
