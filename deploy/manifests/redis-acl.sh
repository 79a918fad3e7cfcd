#!/bin/sh
# Writes Redis's ACL file from redis-acl.conf and one password file per user, before Redis
# starts (compose's `redis-acl` service, the Kubernetes StatefulSet's init container):
#   redis-acl.sh <redis-acl.conf> <folder of password files> <ACL file to write>
# Each `><NAME-password>` of the template becomes `#<SHA-256 of the password>`, read from the
# file NAME of the folder (agents, learner, policy, vllm-sync; trailing newlines dropped, as
# the image's entrypoint drops them from ARLOOP_REDIS_PASSWORD). The file written holds hashes
# only, never a password; it is readable by Redis's user whatever uid wrote it. A missing
# password file, or one under 32 characters, stops Redis from starting: a named reason
# beats a Redis that anyone on the network can write to.
set -eu

if [ "$#" -ne 3 ]; then
    echo "usage: redis-acl.sh <redis-acl.conf> <password folder> <ACL file to write>" >&2
    exit 2
fi
template="$1"
folder="$2"
out="$3"
partial="$out.partial"
: >"$partial"
while IFS= read -r line || [ -n "$line" ]; do
    name="$(printf '%s\n' "$line" | sed -n 's/.*><\([a-z0-9-]*\)-password>.*/\1/p')"
    if [ -n "$name" ]; then
        file="$folder/$name"
        if [ ! -f "$file" ]; then
            echo "redis-acl.sh: no password file $file for the Redis user of '$name'" >&2
            rm -f "$partial"
            exit 1
        fi
        password="$(cat "$file")"
        if [ "${#password}" -lt 32 ]; then
            echo "redis-acl.sh: the password in $file has ${#password} characters, fewer than 32:" \
                "python3 -c 'import secrets; print(secrets.token_urlsafe(32))' > $file" >&2
            rm -f "$partial"
            exit 1
        fi
        hash="$(printf '%s' "$password" | sha256sum | cut -d ' ' -f 1)"
        line="$(printf '%s\n' "$line" | sed "s/><$name-password>/#$hash/")"
    fi
    printf '%s\n' "$line" >>"$partial"
done <"$template"
if grep -q '><[a-z0-9-]*-password>' "$partial"; then
    echo "redis-acl.sh: a placeholder is left in $out" >&2
    rm -f "$partial"
    exit 1
fi
chmod 0644 "$partial"
mv "$partial" "$out"
echo "redis-acl.sh: wrote $out ($(grep -c '^user ' "$out") users)"
