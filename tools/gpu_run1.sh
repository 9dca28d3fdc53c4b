#!/usr/bin/env bash
# Lead's device call 1: trained family (issue 18). Logs under $OUT.
set -uo pipefail
DEADLINE_S=500 bash tools/trained_family_check.sh
