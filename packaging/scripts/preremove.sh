#!/bin/sh
# Stops the hub on removal (not on upgrade). Deb passes "remove"/"upgrade",
# rpm the number of versions left installed (0 on removal).
set -e
case "$1" in
    remove|0)
        if [ -d /run/systemd/system ]; then
            systemctl disable --now fleet.service >/dev/null 2>&1 || true
        fi
        ;;
esac
