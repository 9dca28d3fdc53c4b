#!/usr/bin/env bash
# Device call: trained family. Logs under $OUT.
set -uo pipefail
DEADLINE_S=500 bash tools/trained_family_check.sh
