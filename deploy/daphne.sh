#!/usr/bin/env bash
# One daphne process: WebSockets and HTTP for nginx, on a loopback port.
#
#   deploy/daphne.sh [PORT]        PORT: $OMNIWEB_DAPHNE_PORT, else 8001
#
# Environment (see deploy/omniweb.env.example): the OMNIWEB_* settings, plus
#   OMNIWEB_DAPHNE_HOST   address to bind (default 127.0.0.1: only nginx on this host may connect,
#                         since --proxy-headers trusts X-Forwarded-* from whoever connects)
#   OMNIWEB_PYTHON        interpreter (default: the checkout's .venv/bin/python, else python3)
#
# The message-size limits admit the protocol's largest message (a 4 MiB session.config; video
# frames up to 10 MB): daphne's own default is 1 MiB. The protocol enforces per-type limits itself.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/python.sh"
cd "$root"

port="${1:-${OMNIWEB_DAPHNE_PORT:-8001}}"
case "$port" in
    '' | *[!0-9]*)
        echo "usage: $0 [PORT]  (got '$port')" >&2
        exit 2
        ;;
esac
host="${OMNIWEB_DAPHNE_HOST:-127.0.0.1}"
size="${OMNIWEB_WEBSOCKET_MAX_MESSAGE_SIZE:-16777216}"

export DJANGO_SETTINGS_MODULE="${DJANGO_SETTINGS_MODULE:-omniweb.settings}"
exec "$python" -m daphne \
    --websocket-max-message-size "$size" --websocket-max-frame-size "$size" \
    --proxy-headers -b "$host" -p "$port" \
    omniweb.asgi:application
