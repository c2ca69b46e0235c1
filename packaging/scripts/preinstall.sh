#!/bin/sh
# Creates the system user the hub runs as; its home is the state dir.
set -e
if ! getent group fleet >/dev/null 2>&1; then
    groupadd --system fleet
fi
if ! getent passwd fleet >/dev/null 2>&1; then
    useradd --system --gid fleet --home-dir /var/lib/fleet --no-create-home \
        --shell /usr/sbin/nologin --comment "fleet hub" fleet
fi
