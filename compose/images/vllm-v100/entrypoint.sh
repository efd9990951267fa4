#!/bin/sh
# overlay-manager entrypoint of the vllm-v100 image: apply overlays, build the SM70 kernels, exec vllm serve.
# The same three steps as the entrypoint `overlay compose render` writes (manager/templates/entrypoint.sh.j2);
# a rendered deployment brings its own (with its own overlay list) and this one is not run.
#   OVERLAY_APPLY  overlays to apply (space-separated; empty: none)
#   OVERLAY_BUILD  kernel overlays to build into $OVERLAY_KERNEL_CACHE (empty: none)
set -eu
OVERLAY="${OVERLAY_BIN:-/opt/overlay/bin/overlay}"
# word splitting of the two lists is intended: overlay ids hold no spaces or glob characters
# shellcheck disable=SC2086
if [ -n "${OVERLAY_APPLY:-}" ]; then
  "$OVERLAY" apply $OVERLAY_APPLY
fi
# shellcheck disable=SC2086
if [ -n "${OVERLAY_BUILD:-}" ]; then
  "$OVERLAY" build $OVERLAY_BUILD --cache "${OVERLAY_KERNEL_CACHE:-/var/cache/overlay-kernels}"
fi
exec vllm serve "$@"
