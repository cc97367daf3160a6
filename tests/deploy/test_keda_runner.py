"""nsqworker.testing.keda's pieces that need no KEDA build: its certificates (a real
mutual TLS handshake, as between KEDA's adapter and operator), the aggregation flags,
the manifests routing external metrics (stored by the real kube-apiserver), and how
it finds KEDA. The runner itself needs the one-node cluster with KEDA built (issue 56).
"""

from __future__ import annotations

import base64
import os
import socket
import ssl
import threading
from pathlib import Path
from typing import Any

import pytest

from nsqworker.testing.keda import (
    KedaError,
    KedaRunner,
    aggregation_apiserver_args,
    apiservice_manifests,
    find_keda,
    write_keda_certificates,
)

NODE_IP = "10.254.0.1"


def load(path: Path) -> Any:
    from cryptography import x509

    return x509.load_pem_x509_certificate(path.read_bytes())


def extended_usages(cert: Any) -> set[str]:
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    names = {
        ExtendedKeyUsageOID.SERVER_AUTH: "serverAuth",
        ExtendedKeyUsageOID.CLIENT_AUTH: "clientAuth",
    }
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    return {names.get(oid, oid.dotted_string) for oid in usage}


def test_aggregation_flags_name_a_front_proxy_client_signed_by_their_ca(tmp_path: Path) -> None:
    flags = dict(f.removeprefix("--").split("=", 1) for f in aggregation_apiserver_args(tmp_path))
    assert flags["requestheader-allowed-names"] == "front-proxy-client"
    assert flags["enable-aggregator-routing"] == "true"
    ca = load(Path(flags["requestheader-client-ca-file"]))
    client = load(Path(flags["proxy-client-cert-file"]))
    client.verify_directly_issued_by(ca)
    assert client.subject.rfc4514_string() == "CN=front-proxy-client"
    assert extended_usages(client) == {"clientAuth"}
    ssl.create_default_context().load_cert_chain(
        flags["proxy-client-cert-file"], flags["proxy-client-key-file"]
    )  # the key is the certificate's


def test_keda_certificate_does_mutual_tls_under_kedas_names(tmp_path: Path) -> None:
    """The adapter dials the operator's gRPC with tls.crt, the operator checks it too."""
    certs = write_keda_certificates(tmp_path, NODE_IP)
    ca, tls = str(certs / "ca.crt"), (str(certs / "tls.crt"), str(certs / "tls.key"))
    assert extended_usages(load(certs / "tls.crt")) == {"serverAuth", "clientAuth"}
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(*tls)
    server_ctx.load_verify_locations(ca)
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    for name in ("keda-operator.keda.svc", "keda-operator-metrics-apiserver.keda.svc", NODE_IP):
        client_ctx = ssl.create_default_context(cafile=ca)
        client_ctx.load_cert_chain(*tls)
        a, b = socket.socketpair()
        peer: dict[str, Any] = {}

        def serve(sock: socket.socket = a, peer: dict[str, Any] = peer) -> None:
            with server_ctx.wrap_socket(sock, server_side=True) as tls_sock:
                peer.update(tls_sock.getpeercert() or {})

        thread = threading.Thread(target=serve)
        thread.start()
        with client_ctx.wrap_socket(b, server_hostname=name) as tls_sock:
            assert tls_sock.version() in {"TLSv1.2", "TLSv1.3"}
        thread.join(5)
        assert ("organizationName", "KEDAORG") in [kv for rdn in peer["subject"] for kv in rdn]


def test_apiservice_manifests_are_stored_as_the_aggregator_needs_them(
    kube: Any, tmp_path: Path
) -> None:
    from kubernetes import dynamic

    certs = write_keda_certificates(tmp_path, NODE_IP)
    ca_pem = (certs / "ca.crt").read_bytes()
    kube.create_namespace("keda")
    dyn = dynamic.DynamicClient(kube.api_client())
    stored = {}
    for obj in apiservice_manifests(ca_pem, NODE_IP):
        resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        ns = obj["metadata"].get("namespace") if resource.namespaced else None
        stored[obj["kind"]] = dyn.create(resource, body=obj, namespace=ns).to_dict()
    try:
        service, slice_, apiservice = (
            stored[k] for k in ("Service", "EndpointSlice", "APIService")
        )
        assert "selector" not in service["spec"] or not service["spec"]["selector"]
        # the aggregator picks the slice's port by the Service port's name
        assert slice_["ports"][0]["name"] == service["spec"]["ports"][0]["name"]
        assert slice_["ports"][0]["port"] == service["spec"]["ports"][0]["targetPort"]
        assert slice_["endpoints"][0]["addresses"] == [NODE_IP]
        spec = apiservice["spec"]
        assert base64.b64decode(spec["caBundle"]) == ca_pem
        assert spec["service"] == {
            "name": service["metadata"]["name"],
            "namespace": "keda",
            "port": service["spec"]["ports"][0]["port"],
        }
    finally:
        api = dyn.resources.get(api_version="apiregistration.k8s.io/v1", kind="APIService")
        dyn.delete(api, name="v1beta1.external.metrics.k8s.io")


def test_find_keda_names_install_tools_when_a_part_is_missing(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("keda-operator", "keda-adapter"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        os.chmod(bin_dir / name, 0o755)
    with pytest.raises(FileNotFoundError, match="scripts/install-tools keda"):
        find_keda(bin_dir)  # no keda-src next to bin
    crd = tmp_path / "keda-src" / "config" / "crd"
    crd.mkdir(parents=True)
    (crd / "kustomization.yaml").write_text("resources: []\n")
    found = find_keda(bin_dir)
    assert found.operator == str(bin_dir / "keda-operator")
    assert found.config == (tmp_path / "keda-src" / "config").resolve()


def test_the_runner_says_when_the_api_server_has_no_aggregation_flags(
    kube: Any, tmp_path: Path
) -> None:
    """The session's control plane was started without front-proxy flags."""
    import subprocess

    from nsqworker.testing import find_binary

    kubectl = find_binary("kubectl")

    class Host:
        kubeconfig = kube.kubeconfig
        server = kube.server

        def kubectl(self, *args: str, timeout: float = 60, check: bool = True) -> str:
            argv = [kubectl, f"--kubeconfig={kube.kubeconfig}", *args]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
            assert done.returncode == 0 or not check, done.stderr
            return done.stdout

        def start_process(self, name: str, argv: Any) -> Any:
            raise AssertionError("nothing may start")

        def forward(self, port: int, host_port: int | None = None) -> int:
            raise AssertionError("nothing may start")

    fake = find_keda_fake(tmp_path)
    with pytest.raises(KedaError, match="aggregation_apiserver_args"):
        KedaRunner(Host(), tmp_path / "keda", binaries=fake).start()


def find_keda_fake(tmp_path: Path) -> Any:
    from nsqworker.testing.keda import KedaBinaries

    return KedaBinaries("/bin/false", "/bin/false", tmp_path)
