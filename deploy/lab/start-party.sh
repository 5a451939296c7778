#!/bin/sh
# Start this host's party from its env file; parties first wait until the coordinator serves.
#   deploy/lab/start-party.sh deploy/lab/hosts/lab2.env
set -eu
if [ $# -ne 1 ] || [ ! -r "$1" ]; then
    echo "usage: $0 deploy/lab/hosts/<host>.env" >&2
    exit 2
fi
. "$1"
mkdir -p "$VFLNET_RUN_DIR"
if [ "$VFLNET_ROLE" = coordinator ]; then
    exec vflnet party --role "$VFLNET_ROLE" --config "$VFLNET_CONFIG" --name "$VFLNET_NAME" \
        --run-dir "$VFLNET_RUN_DIR" --listen "$VFLNET_LISTEN"
fi
vflnet health "$VFLNET_COORDINATOR" --wait 600 --ca "$VFLNET_CA" --cert "$VFLNET_CERT" --key "$VFLNET_KEY"
exec vflnet party --role "$VFLNET_ROLE" --config "$VFLNET_CONFIG" --name "$VFLNET_NAME" \
    --run-dir "$VFLNET_RUN_DIR" --listen "$VFLNET_LISTEN" --coordinator "$VFLNET_COORDINATOR"
