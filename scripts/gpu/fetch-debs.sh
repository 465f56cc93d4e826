#!/usr/bin/env bash
# Downloads (does not install) into .gpu/debs the Debian packages the GPU host lacks for building
# ciuic there (scripts/gpu/build-on-host.sh): toml++, Boost 1.74 with Program_options, libyaml, ICU, gloo's
# headers. Run here (a machine with Debian's registry); carry .gpu to the device tool.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .gpu/debs && cd .gpu/debs
apt-get download libtomlplusplus-dev libtomlplusplus3 libgloo-dev libboost-program-options1.74-dev \
  libboost-program-options1.74.0 libboost1.74-dev libpcre2-dev libpcre2-8-0 libyaml-dev libyaml-0-2 libicu-dev libicu72 2>&1 | grep -v unsandboxed || true
ls -la
