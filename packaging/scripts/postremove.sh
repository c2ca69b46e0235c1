#!/bin/sh
# The state in /var/lib/fleet and the fleet user are kept: they hold the
# fleet's database and the console's host key.
set -e
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || true
fi
