#!/bin/sh
# The image's entrypoint: turns secret files into ARLOOP_* variables, then runs the command.
#
# Compose mounts each secret as a file under /run/secrets (Kubernetes can mount a Secret the
# same way); arloop reads its settings from the environment. Each regular file named like a
# variable (ARLOOP_SECRET_KEY, ARLOOP_API_KEYS, ...) in $SECRETS_DIR (default /run/secrets)
# becomes that variable, its trailing newlines dropped, unless the variable is already set:
# an explicit environment wins. The contents are never evaluated by the shell.
set -eu

dir="${SECRETS_DIR:-/run/secrets}"
if [ -d "$dir" ]; then
    for file in "$dir"/ARLOOP_*; do
        [ -f "$file" ] || continue
        name="${file##*/}"
        case "$name" in
            *[!A-Z0-9_]*)
                echo "arloop-entrypoint: ignoring $file: not an upper-case ARLOOP_* variable name" >&2
                continue
                ;;
        esac
        if eval "[ -z \"\${$name+set}\" ]"; then
            value="$(cat "$file")"
            export "$name=$value"
        fi
    done
fi

if [ "$#" -eq 0 ]; then
    set -- arloop --help
fi
exec "$@"
