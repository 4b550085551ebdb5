#!/usr/bin/env bash
# Runs the pipeline example ($1) on the simulator; it checks its own output and the race oracle.
set -euo pipefail
WEFT_DRIVER=sim exec "$1"
