# Sourced by daphne.sh and worker.sh: the repository root and the interpreter to run it with
# (OMNIWEB_PYTHON, else the checkout's .venv/bin/python, else python3).
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${OMNIWEB_PYTHON:-}"
if [ -z "$python" ]; then
    if [ -x "$root/.venv/bin/python" ]; then python="$root/.venv/bin/python"; else python=python3; fi
fi
