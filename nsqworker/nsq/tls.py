"""TLS and compression for a connection: SSL contexts from files, snappy and deflate codecs."""

from __future__ import annotations

import asyncio
import ssl
import zlib
from collections.abc import Callable
from typing import Any

from nsqworker.errors import ConfigurationError, ConnectionClosed

__all__ = ["compression_codecs", "import_snappy", "ssl_context", "start_tls"]

Codec = Callable[[bytes], bytes]


def ssl_context(ca_file: Any, cert_file: Any, key_file: Any, verify: bool) -> ssl.SSLContext:
    """A client SSL context from optional CA, certificate and key files."""
    try:
        context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(f"tls_ca_file: cannot load {ca_file}: {exc}") from exc
    if cert_file:
        try:
            context.load_cert_chain(str(cert_file), str(key_file) if key_file else None)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigurationError(
                f"tls_cert_file/tls_key_file: cannot load {cert_file}: {exc}"
            ) from exc
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def import_snappy() -> Any:
    """The python-snappy module, or a ConfigurationError saying how to install it."""
    try:
        import snappy
    except ImportError as exc:
        raise ConfigurationError(
            "compression='snappy' needs python-snappy: pip install 'nsq-worker[snappy]'"
        ) from exc
    return snappy


def compression_codecs(snappy: Any, deflate_level: int) -> tuple[Codec, Codec]:
    """``(compress, decompress)`` for one stream: snappy when ``snappy`` is the module,
    else raw deflate at ``deflate_level``. Each side keeps its own stream state."""
    if snappy is not None:
        return snappy.StreamCompressor().add_chunk, snappy.StreamDecompressor().decompress
    compressor = zlib.compressobj(deflate_level, zlib.DEFLATED, -zlib.MAX_WBITS)
    sync = zlib.Z_SYNC_FLUSH

    def deflate(data: bytes) -> bytes:
        return compressor.compress(data) + compressor.flush(sync)

    return deflate, zlib.decompressobj(-zlib.MAX_WBITS).decompress


async def start_tls(
    protocol: asyncio.Protocol,
    transport: asyncio.Transport,
    context: ssl.SSLContext | None,
    server_hostname: str | None,
    timeout: float,
    address: str,
) -> asyncio.Transport:
    """Upgrade the plain ``transport`` of ``protocol`` (a connection to nsqd at
    ``address``) to TLS; the new transport."""
    upgraded = await asyncio.get_running_loop().start_tls(
        transport,
        protocol,
        context or ssl.create_default_context(),
        server_hostname=server_hostname,
        ssl_handshake_timeout=timeout,
    )
    if upgraded is None:
        raise ConnectionClosed(f"TLS handshake with nsqd at {address} failed")
    return upgraded
