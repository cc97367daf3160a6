"""Every exception nsqworker raises, split by whose fault it is.

``NSQWorkerError`` is the root. Below it:

* ``ConfigurationError`` and ``LocalProtocolError``: the caller asked for something
  that cannot work (a bad setting, a bad topic name, an oversized body). Fix the call.
* ``RemoteProtocolError``, ``NSQDError`` and ``ConnectionClosed``: the server or the
  network did something; retrying elsewhere or later may help.
* ``RpcError``, ``RpcTimeout`` and ``RpcDecodeError``: an RPC call's endpoint raised,
  did not answer in time, or sent bytes that are not the RPC wire format.
"""

from __future__ import annotations

__all__ = [
    "AlreadyResponded",
    "AuthError",
    "ConfigurationError",
    "ConnectionClosed",
    "InvalidName",
    "LocalProtocolError",
    "MessageTooLarge",
    "NSQDError",
    "NSQWorkerError",
    "NoConnection",
    "PublishError",
    "RemoteProtocolError",
    "RpcDecodeError",
    "RpcError",
    "RpcTimeout",
]

# nsqd answers these without closing the connection; every other E_* is fatal.
NON_FATAL_CODES = frozenset({"E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"})


class NSQWorkerError(Exception):
    """Raised for anything that goes wrong inside nsqworker; the root of all its errors."""


class ConfigurationError(NSQWorkerError, ValueError):
    """Raised when a setting, a task option or a call argument cannot work."""


class LocalProtocolError(ConfigurationError):
    """Raised before sending when a command would break the NSQ protocol."""


class InvalidName(LocalProtocolError):
    """Raised when a topic or channel name is not one nsqd accepts."""


class MessageTooLarge(LocalProtocolError):
    """Raised before publishing a body larger than the limit nsqd is known to enforce."""

    def __init__(self, size: int, limit: int, what: str = "message body") -> None:
        self.size = size
        self.limit = limit
        super().__init__(
            f"{what} is {size} bytes, more than nsqd's limit of {limit} bytes "
            "(nsqd --max-msg-size / --max-body-size); split or shrink it"
        )


class AlreadyResponded(NSQWorkerError, RuntimeError):
    """Raised when a message is finished, requeued or touched after it was answered."""


class RemoteProtocolError(NSQWorkerError):
    """Raised when the peer sends bytes that are not valid NSQ V2 frames."""


class NSQDError(NSQWorkerError):
    """Raised when nsqd answers a command with an ``E_*`` error frame.

    ``code`` is nsqd's code (``E_BAD_TOPIC``...), ``fatal`` tells whether nsqd closes
    the connection after it.
    """

    def __init__(self, code: str, message: str = "") -> None:
        self.code = code
        self.message = message
        self.fatal = code not in NON_FATAL_CODES
        super().__init__(f"{code} {message}".strip())

    @classmethod
    def from_frame(cls, data: bytes) -> NSQDError:
        """Build the error from an error frame's payload (``b"E_CODE text"``)."""
        text = data.decode("utf-8", "replace")
        code, _, message = text.partition(" ")
        if code.startswith("E_AUTH") or code == "E_UNAUTHORIZED":
            return AuthError(message, code=code)
        return cls(code, message)


class AuthError(NSQDError):
    """Raised when nsqd requires AUTH and no secret is set, or refuses the secret."""

    def __init__(self, message: str, code: str = "E_AUTH_REQUIRED") -> None:
        super().__init__(code, message)


class PublishError(NSQDError):
    """Raised when nsqd refuses a PUB, MPUB or DPUB; ``code`` says why."""


class ConnectionClosed(NSQWorkerError, ConnectionError):
    """Raised for every command pending on a connection that closed.

    ``reason`` says why in words; ``error`` is nsqd's fatal error when there was one.
    """

    def __init__(self, reason: str, error: NSQDError | None = None) -> None:
        self.reason = reason
        self.error = error
        super().__init__(reason if error is None else f"{reason}: {error}")


class NoConnection(NSQWorkerError, ConnectionError):
    """Raised when no nsqd could be reached within the timeout."""


class UndecodableBody(NSQWorkerError, ValueError):
    """Raised by ``Message.json()`` for a body that is not JSON or nests too deeply.

    A handler that lets it escape gives the message up at once, like ``Reject``
    (dead-letter hooks, FIN, no consumer backoff): the body will not decode on a later
    delivery either. Being a ``ValueError``, ``except ValueError`` still catches it.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class RpcDecodeError(RemoteProtocolError):
    """Raised when an RPC request, response or body is not in the RPC wire format."""


class RpcError(NSQWorkerError):
    """Raised by an RPC call whose endpoint answered with an error.

    ``type`` and ``message`` are the remote exception's class name and text.
    """

    def __init__(self, type: str, message: str, topic: str = "") -> None:
        self.type = type
        self.message = message
        self.topic = topic
        where = f" from {topic!r}" if topic else ""
        super().__init__(f"{type}{where}: {message}" if message else f"{type}{where}")

    def __reduce__(self) -> tuple[type[RpcError], tuple[str, str, str]]:
        return RpcError, (self.type, self.message, self.topic)


class RpcUserError(NSQWorkerError):
    """Raise in an ``@rpc`` function for an error whose text the caller may read.

    Other exceptions reach the caller as a generic error with a correlation id unless
    ``rpc_error_details`` is on (their text may hold what callers must not see)."""


class RpcTimeout(NSQWorkerError, TimeoutError):
    """Raised by an RPC call that got no reply within its timeout."""
