#!/usr/bin/env bash
# The README's main job. Until the trainer lands (issue 4) this builds ktune and prints its
# commands; it will fine-tune the bundled tiny model on the bundled dataset offline.
set -euo pipefail
BUILD=${1:-build/release}
"$BUILD/bin/ktune" --help
