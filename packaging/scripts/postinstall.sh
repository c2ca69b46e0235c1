#!/bin/sh
# Picks up the unit; on an upgrade restarts a hub that was running (the hub
# adopts its engines, which keep running). A new install is not started:
# the operator chooses its flags in /etc/fleet/fleet.env first.
set -e
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || true
    if systemctl is-active --quiet fleet.service; then
        systemctl restart fleet.service || true
    else
        echo "fleet: start the hub with: sudo systemctl enable --now fleet (flags in /etc/fleet/fleet.env)"
    fi
fi
