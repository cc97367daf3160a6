"""Where the test fixtures and ``nsqworker dev broker`` look for broker binaries, and
what they tell a user to run when one is missing.

The same places in a user's own project as in a clone of nsqworker, in this order:

1. a directory given on the command line (``--nsqd-bin-dir``, ``--bin-dir``);
2. ``$NSQWORKER_TOOLS_BIN``;
3. ``PATH``;
4. the user's tools directory, ``$XDG_DATA_HOME/nsqworker/bin`` (by default
   ``~/.local/share/nsqworker/bin``), where the install lines below put them;
5. ``.tools/bin`` of the current directory or a parent (a clone after ``make tools``).

RabbitMQ runs from a Debian root filesystem (with ``chroot``, as root): looked up in
``$NSQWORKER_RABBITMQ_ROOTFS``, next to ``$NSQWORKER_TOOLS_BIN`` (``../rabbitmq/rootfs``),
in the user's tools directory (``rabbitmq/rootfs``), then in ``.tools/rabbitmq/rootfs``
above the current directory.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "ROOTFS_ENV",
    "TOOLS_BIN_ENV",
    "nats_install_hint",
    "nsq_install_hint",
    "rabbitmq_install_hint",
    "user_bin_dir",
    "user_tools_dir",
]

TOOLS_BIN_ENV = "NSQWORKER_TOOLS_BIN"
"""Environment variable naming a directory that holds nsqd, nsqlookupd, nats-server..."""
ROOTFS_ENV = "NSQWORKER_RABBITMQ_ROOTFS"
"""Environment variable naming a RabbitMQ root filesystem (a directory)."""

NSQ_VERSION = "v1.3.0"
NATS_VERSION = "v2.15.2"
DEBIAN_SUITE = "trixie"  # its rabbitmq-server is 4.0.5: streams with single active consumer


def user_tools_dir() -> Path:
    """``$XDG_DATA_HOME/nsqworker``, by default ``~/.local/share/nsqworker``."""
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "nsqworker"


def user_bin_dir() -> Path:
    """The user's tools directory's ``bin``: where the install hints put binaries."""
    return user_tools_dir() / "bin"


def nsq_install_hint() -> str:
    """How to install nsqd and nsqlookupd, as commands a user can paste."""
    apps = " ".join(
        f"github.com/nsqio/nsq/apps/{app}@{NSQ_VERSION}" for app in ("nsqd", "nsqlookupd")
    )
    return (
        f"install NSQ {NSQ_VERSION}: `GOBIN={user_bin_dir()} go install {apps}`, or unpack"
        " a release from https://nsq.io/deployment/installing.html and put nsqd and"
        f" nsqlookupd on PATH or in {user_bin_dir()} (NSQWORKER_TOOLS_BIN=DIR, or pytest's"
        " --nsqd-bin-dir DIR, names another directory); then `nsqworker dev broker"
        " --transport nsq` starts them"
    )


def nats_install_hint() -> str:
    """How to install nats-server, as commands a user can paste."""
    return (
        f"install nats-server {NATS_VERSION}: `GOBIN={user_bin_dir()} go install"
        f" github.com/nats-io/nats-server/v2@{NATS_VERSION}`, or unpack a release from"
        f" https://github.com/nats-io/nats-server/releases into {user_bin_dir()} or onto PATH"
        " (NSQWORKER_TOOLS_BIN=DIR names another directory); then"
        " `nsqworker dev broker --transport nats` starts it with JetStream"
    )


def rabbitmq_install_hint() -> str:
    """How to get a RabbitMQ with streams, as commands a user can paste."""
    rootfs = user_tools_dir() / "rabbitmq" / "rootfs"
    return (
        "build a RabbitMQ 4.0 root filesystem as root (Debian's debootstrap, about a minute):"
        f" `apt-get install -y debootstrap && debootstrap --variant=minbase"
        f" --include=rabbitmq-server {DEBIAN_SUITE} {rootfs} http://deb.debian.org/debian`"
        f" ({ROOTFS_ENV}=DIR names another place), then `nsqworker dev broker --transport"
        " rabbitmq-stream` runs it; or point the tests at a RabbitMQ you run, stream plugin"
        " enabled: RABBITMQ_STREAM_TEST_URI=rabbitmq-stream://guest:guest@127.0.0.1:5552/"
    )
