#!/usr/bin/env bash
# One engine worker: runs the engine runtime (the models) for requests that daphne processes send
# over Redis to the named channel $OMNIWEB_ENGINE_CHANNEL (default omniweb-engine).
#
#   deploy/worker.sh [GPU]         GPU: an index for CUDA_VISIBLE_DEVICES (one worker per GPU)
#
# Needs OMNIWEB_REDIS_URL (the same Redis as the daphne processes). OMNIWEB_PYTHON as in daphne.sh.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/python.sh"
cd "$root"

if [ -z "${OMNIWEB_REDIS_URL:-}" ]; then
    echo "$0: OMNIWEB_REDIS_URL is not set: workers and daphne meet on Redis" >&2
    exit 2
fi
if [ $# -ge 1 ] && [ -n "$1" ]; then
    case "$1" in
        *[!0-9]*)
            echo "usage: $0 [GPU-INDEX]  (got '$1')" >&2
            exit 2
            ;;
    esac
    export CUDA_VISIBLE_DEVICES="$1"
fi

export DJANGO_SETTINGS_MODULE="${DJANGO_SETTINGS_MODULE:-omniweb.settings}"
exec "$python" manage.py runworker "${OMNIWEB_ENGINE_CHANNEL:-omniweb-engine}"
