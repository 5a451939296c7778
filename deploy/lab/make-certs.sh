#!/bin/sh
# Make the lab's CA and one certificate per host from hosts/*.env, into deploy/lab/certs/
# (run it once, on a trusted machine; existing files are kept, --force renews everything).
#   deploy/lab/make-certs.sh [--force]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
set -- --out "$here/certs" "$@"
for env in "$here"/hosts/*.env; do
    VFLNET_NAME=; VFLNET_ROLE=; VFLNET_CERT_HOSTS=
    . "$env"
    set -- "$@" --party "$VFLNET_NAME:$VFLNET_ROLE:$VFLNET_CERT_HOSTS"
done
exec vflnet certs "$@"
